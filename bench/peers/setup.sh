#!/usr/bin/env bash
# Creates the Python environment the peer benchmarks run in: target/peers-venv under the
# repository root (whatever the current directory), with the pinned versions of
# bench/peers/requirements.txt. Idempotent: when the environment already holds exactly those
# pins it returns at once.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/peers-venv"
reqs="$here/requirements.txt"
stamp="$venv/.requirements.sha256"
python="${PYTHON:-python3}"

want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "peers venv up to date: $venv"
    exit 0
fi

if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)'; then
    echo "setup.sh: $python is older than Python 3.9" >&2
    exit 1
fi

mkdir -p "$root/target"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
"$venv/bin/python" - <<'PY'
import apscheduler, celery, kombu, pika, redis, sqlalchemy
print(f"celery {celery.__version__}, kombu {kombu.__version__}, redis-py {redis.__version__}, "
      f"APScheduler {apscheduler.__version__}, SQLAlchemy {sqlalchemy.__version__}, pika {pika.__version__}")
PY
echo "$want" > "$stamp"
echo "peers venv ready: $venv"
