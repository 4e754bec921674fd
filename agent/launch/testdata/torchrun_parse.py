# Parses each command line in the JSON list on stdin with torchrun's own
# argument parser and prints what it means, as JSON, for launch's tests.
import json, sys
from torch.distributed.run import get_args_parser

out = []
for argv in json.load(sys.stdin):
    a = get_args_parser().parse_args(argv)
    out.append({
        "nproc_per_node": str(a.nproc_per_node), "nnodes": str(a.nnodes), "node_rank": int(a.node_rank),
        "standalone": bool(a.standalone), "max_restarts": int(a.max_restarts), "module": bool(a.module),
        "no_python": bool(a.no_python), "role": a.role, "log_dir": a.log_dir or "",
        "redirects": str(a.redirects), "tee": str(a.tee), "rdzv_backend": a.rdzv_backend,
        "rdzv_endpoint": a.rdzv_endpoint, "rdzv_id": a.rdzv_id, "master_addr": a.master_addr,
        "master_port": int(a.master_port), "monitor_interval": float(a.monitor_interval),
        "script": a.training_script, "script_args": a.training_script_args,
    })
print(json.dumps(out))
