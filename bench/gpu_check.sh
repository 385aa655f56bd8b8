#!/usr/bin/env bash
# One prepared GPU check (not run by CI): correctness of the triton and device
# variants on CUDA, then their timings (bench/gpu_bench.py). Run from the
# repository root on a CUDA machine:
#
#     bash bench/gpu_check.sh            # results in $OUT (default ./reports)
#     bash bench/gpu_check.sh --wheels   # on a machine with a package index: fetch
#                                        # the wheels a bare CUDA machine lacks into .whl/
#
# Steps, each with its own time limit; a failing step is recorded in
# $OUT/gpu_check.md and the next one runs (exit status: 0 only if all passed):
#   1. environment: which python, torch, triton, GPU;
#   2. dependencies, never moving torch or triton: tensordict and its small
#      dependencies from .whl/ (carried there, no network needed), else from the
#      package index if one answers; rbcheck installed --no-deps (editable),
#      else imported through a shim folder on PYTHONPATH;
#   3. tests/variants/test_triton.py, test_cuda.py, test_overflow.py on CUDA;
#   4. python -m bench.gpu_bench (2^24 and 2^20; JSON and markdown);
#   5. pytest rbcheck/conformance --impl triton --rbcheck-device cuda (ci profile);
#   6. python -m bench.gpu_profile (where the time goes; what CUDA graphs could save).
# Budgets (seconds) add up to about 7 minutes: override with GPU_CHECK_BUDGETS
# ("setup tests bench conformance profile", default "60 90 150 80 60"; a budget of -
# for the bench or the profile skips it).
set -u
cd "$(dirname "$0")/.."
WHEELS="tensordict==0.14.3 orjson pyvers importlib_metadata zipp lazy-importer"

if [ "${1:-}" = "--wheels" ]; then
    mkdir -p .whl
    exec python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl $WHEELS
fi

OUT="${OUT:-reports}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
SUMMARY="$OUT/gpu_check.md"
: >"$LOG"
read -r B_SETUP B_TESTS B_BENCH B_CONF B_PROFILE <<<"${GPU_CHECK_BUDGETS:-60 90 150 80 60}"
B_PROFILE="${B_PROFILE:-60}"
PY="${PYTHON:-python3}"
export PY WHEELS PYTHONUNBUFFERED=1 RBCHECK_PROFILE=ci
STATUS=0
ROWS=()

step() {  # step NAME BUDGET COMMAND...: run with a time limit, log, record
    local name="$1" budget="$2"
    shift 2
    local start=$SECONDS
    echo "=== $name (limit ${budget}s): $*" | tee -a "$LOG"
    timeout -k 10 "$budget" "$@" >>"$LOG" 2>&1
    local rc=$?
    local took=$((SECONDS - start))
    local what="ok"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then what="TIMED OUT"; elif [ $rc -ne 0 ]; then what="FAILED (rc $rc)"; fi
    [ $rc -ne 0 ] && STATUS=1
    echo "=== $name: $what in ${took}s" | tee -a "$LOG"
    ROWS+=("| $name | $what | ${took} s |")
    return $rc
}

setup() {
    echo "--- environment"
    command -v "$PY"
    nvidia-smi -L 2>&1 | head -4
    "$PY" - <<'PYEOF' || return 1
import importlib, platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for name in ("triton", "tensordict", "safetensors", "hypothesis", "pytest", "scipy", "numpy"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as error:
        print("missing:", name, type(error).__name__, error)
PYEOF
    echo "--- dependencies"
    if ! "$PY" -c "import tensordict" 2>/dev/null; then
        if compgen -G ".whl/*.whl" >/dev/null; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu_check_site \
                .whl/*.whl || return 1
        else  # a package index may answer; --no-deps: torch and triton stay as they are
            timeout 60 "$PY" -m pip install -q --no-deps --retries 0 --timeout 5 \
                --target /tmp/gpu_check_site $WHEELS || echo "no index answered and no .whl/"
        fi
    fi
    if "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/gpu_check_pip.txt 2>&1; then
        echo "rbcheck installed (editable, no dependencies)"
    else
        cat /tmp/gpu_check_pip.txt
        echo "editable install failed: importing rbcheck through a shim folder"
        rm -rf /tmp/gpu_check_shim && mkdir -p /tmp/gpu_check_shim
        cp -r rbcheck /tmp/gpu_check_shim/rbcheck
        for part in reference variants harness; do ln -s "$PWD/$part" "/tmp/gpu_check_shim/rbcheck/$part"; done
    fi
    "$PY" -c "import rbcheck.variants.triton_tree as t, tensordict; \
print('rbcheck imports; triton kernels:', t.UNAVAILABLE or 'available'); print('tensordict', tensordict.__version__)"
    "$PY" -c "from rbcheck.variants import native; \
print('native library:', native.unavailable_reason() or 'loaded', '; its calls:', native.calls_reason() or 'calls.c module')"
}

export PYTHONPATH="/tmp/gpu_check_shim${PYTHONPATH:+:$PYTHONPATH}:/tmp/gpu_check_site"  # the machine's own packages first
export -f setup
step setup "$B_SETUP" bash -c setup
step tests "$B_TESTS" "$PY" -m pytest tests/variants/test_triton.py tests/variants/test_cuda.py \
    tests/variants/test_overflow.py tests/variants/test_native_calls.py -q -p no:cacheprovider -rfEs
if [ "$B_BENCH" = "-" ]; then
    ROWS+=("| bench | skipped (budget -) | 0 s |")
else
    step bench "$B_BENCH" "$PY" -m bench.gpu_bench --out "$OUT" --budget $((B_BENCH * 2 / 3))
fi
step conformance "$B_CONF" "$PY" -m pytest rbcheck/conformance --impl triton --rbcheck-device cuda \
    --rbcheck-profile ci -q -p no:cacheprovider -rfE --maxfail=10
if [ "$B_PROFILE" = "-" ]; then
    ROWS+=("| profile | skipped (budget -) | 0 s |")
else
    step profile "$B_PROFILE" "$PY" -m bench.gpu_profile --out "$OUT"
fi

{
    echo "# GPU check"
    echo
    echo "| step | result | time |"
    echo "|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Log: gpu_check.log; timings: gpu_bench.md / gpu_bench.json; profile: gpu_profile.txt / gpu_profile.json."
} >"$SUMMARY"
cat "$SUMMARY"
[ -f "$OUT/gpu_bench.md" ] && cat "$OUT/gpu_bench.md"
exit $STATUS
