"""The package names each environment variable once, in ddp_agent/_env.py (issue 32, item 10).

A literal "DDP_AGENT_..." anywhere else in the package fails this test, so a
variable cannot be read under two spellings or renamed in one place only.
Docstrings and comments may mention the names; only string literals count.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "ddp_agent"


def _literals(path: pathlib.Path):
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.lineno, node.value


def test_env_names_only_in_env_module():
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "_env.py":
            continue
        for line, value in _literals(path):
            if value.startswith("DDP_AGENT_"):
                found.append(f"{path.name}:{line}: {value!r}")
    assert not found, "use ddp_agent._env instead of literals:\n" + "\n".join(found)


def test_env_module_names_are_distinct():
    from ddp_agent import _env

    names = {k: v for k, v in vars(_env).items() if k.isupper()}
    assert names, "ddp_agent._env defines no names"
    assert all(v.startswith("DDP_AGENT_") for v in names.values()), names
    assert len(set(names.values())) == len(names), names
