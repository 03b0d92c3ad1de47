#!/usr/bin/env bash
# The device check on a lent GPU machine, in one command from the repository root:
#   bash backends/gpu/devcheck-on-device.sh
# No network is needed. It installs the wheels in shared/gpu-wheels (ray, simpy,
# megatron-core and ray's jsonschema stack, made by `../shared/tools/pack-gpu-wheels DIR`)
# with `pip --no-index --no-deps --target` into a private folder, as that script says,
# and puts that folder and the repository on PYTHONPATH: the host's own torch,
# transformers and aiohttp stay as they are, nothing is installed into its Python.
# Then `python -m backends.gpu devcheck --out "$OUT/devcheck"` (the machine gives $OUT;
# the report is devcheck.json there, the children's logs under logs/), cut off after
# DEVCHECK_TIMEOUT_S (default 480) so that the report, written after every check, is
# printed whatever happens; a one-line-a-check summary comes last. Exit code: the
# device check's (0 passed, 1 a check failed, 3 no GPU checked: all skipped, 124 cut off).
# Settings: OUT, WHEELS (default shared/gpu-wheels), PYTHON, DEVCHECK_TIMEOUT_S.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
out="${OUT:-/tmp/devcheck-out}/devcheck"
wheels="${WHEELS:-shared/gpu-wheels}"
py="${PYTHON:-$(command -v python3 || command -v python)}"
limit="${DEVCHECK_TIMEOUT_S:-480}"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
mkdir -p "$out"
echo "== $("$py" --version 2>&1) at $py; $("$py" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

site=$(mktemp -d /tmp/devcheck-site.XXXXXX)
if compgen -G "$wheels/*.whl" >/dev/null; then
  start=$SECONDS
  if "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheels"/*.whl; then
    echo "== installed $(ls "$wheels"/*.whl | wc -l) wheels into $site in $((SECONDS - start)) s"
  else
    echo "!! installing the wheels failed: the checks that need them will say so" >&2
  fi
else
  echo "!! no wheels in $wheels: ray, simpy and megatron-core only if the host has them" >&2
fi
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The CLI entry if it loads, else the runner's own (same flags).
entry=(-m backends.gpu devcheck)
"$py" -m backends.gpu devcheck --help >/dev/null 2>&1 || entry=(-m backends.gpu.devcheck)
echo "== $py ${entry[*]} --out $out (cut off after $limit s)"
timeout -k 15 "$limit" "$py" "${entry[@]}" --out "$out"
rc=$?
[ "$rc" = 124 ] && echo "!! cut off after $limit s: the report holds the checks that ended" >&2

if [ -f "$out/devcheck.json" ]; then
  cat "$out/devcheck.json"
  "$py" - "$out/devcheck.json" <<'PY'
import json, sys

report = json.load(open(sys.argv[1]))
print(f"== devcheck: exit {report.get('exit_code')}, {report.get('elapsed_s') or 0:.0f} s, "
      f"cuda: {report.get('cuda')}")
for name, entry in report["checks"].items():
    status = entry["status"]
    detail = entry.get("reason") or entry.get("error") or ""
    if not detail:
        keep = ("gbps", "ratio_to_ceiling", "bitwise", "p2p_ok", "transports", "refused",
                "message", "logits_max_abs_diff", "loss", "oracles", "mean_reward_first",
                "mean_reward_last", "device", "modules")
        figures = entry.get("figures", {})
        detail = ", ".join(f"{k}={figures[k]}" for k in keep if k in figures)
    print(f"   {name:28} {status:8} {entry.get('seconds', 0):6.1f} s  {detail.splitlines()[0][:300] if detail else ''}")
PY
else
  echo "!! no report at $out/devcheck.json" >&2
fi
exit "$rc"
