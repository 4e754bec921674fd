#!/usr/bin/env bash
# Fails when git tracks a compiled program or library (an ELF file): build
# outputs stay out of the repository (.gitignore lists where make puts
# them). A 42 MB ddp-agent, built at the checkout's root by
# `go build ./agent/cmd/ddp-agent`, went in once with a commit's `git add -A`.
set -euo pipefail
cd "$(dirname "$0")/.."
found=
# git marks a file without text as "-text" in the index; each entry is
# "i/... w/... attr/...<TAB>path", NUL-terminated (any path, spaces too).
while IFS= read -r -d '' entry; do
	info=${entry%%$'\t'*} f=${entry#*$'\t'}
	case $info in i/-text*) ;; *) continue ;; esac
	if [ -f "$f" ] && [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ]; then
		found="$found $f"
	fi
done < <(git ls-files --eol -z)
if [ -n "$found" ]; then
	echo "build outputs tracked by git (git rm --cached them):$found" >&2
	exit 1
fi
