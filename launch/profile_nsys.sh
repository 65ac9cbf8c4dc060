#!/usr/bin/env bash
# Profile a benchmark (or any command) with Nsight Systems, recording only the measured
# steps: warm-up, cuDNN/cuBLAS autotuning and torch.compile stay out of the report.
#
# Usage:
#   launch/profile_nsys.sh [-o NAME] [-- COMMAND [ARGS...]]
#
#   # default: GPT-2 124M, bf16, eager, one full training step per iteration
#   launch/profile_nsys.sh
#   # one configuration of the benchmark, with a report name
#   launch/profile_nsys.sh -o gpt2_compiled -- \
#       python -m gpt.bench model --sizes gpt2 --modes step --precision bf16 --compile on --nvtx
#   # naive attention: see attn.scores / attn.softmax / attn.output as NVTX ranges
#   launch/profile_nsys.sh -o naive -- python -m gpt.bench model --attention naive --modes fwdbwd --nvtx
#
# How warm-up is excluded: nsys starts with --capture-range=cudaProfilerApi, so it records
# nothing until the program calls cudaProfilerStart(). `python -m gpt.bench ... --nvtx`
# (or --cuda-profiler-range) calls it after the warm-up iterations and cudaProfilerStop()
# after the measured ones (gpt.report.profiling.cuda_profiler_range); the trainer does the same
# for the steps it is told to profile. With --capture-range-end=stop the first such range
# is the report, so profile ONE configuration per run (a sweep would only record its first
# cell); set NSYS_CAPTURE_END=repeat to get one report per range instead.
#
# NVTX ranges (--nvtx): "bench:<cell>", "step", "forward", "backward", "optimizer", and
# inside naive attention "attn.scores", "attn.softmax", "attn.output".
#
# Output: NAME.nsys-rep (open in the Nsight Systems GUI, or `nsys stats NAME.nsys-rep`).
# Environment: PYTHON (for the default command; default: the active virtual environment's,
# else python3, see launch/find_python.sh), NSYS (default nsys), NSYS_CAPTURE_END (stop),
# NSYS_EXTRA_ARGS (extra flags for `nsys profile`, word-split).
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

output="profiles/nsys_$(date +%Y%m%d_%H%M%S)"
while [[ $# -gt 0 ]]; do
    case "$1" in
        -o|--output)
            [[ $# -ge 2 ]] || { echo "error: $1 needs a value" >&2; exit 2; }
            output="$2"
            shift 2
            ;;
        -h|--help)
            usage
            exit 0
            ;;
        --)
            shift
            break
            ;;
        *)
            echo "error: unknown option '$1' (put the command to profile after --)" >&2
            exit 2
            ;;
    esac
done

if [[ $# -eq 0 ]]; then
    source "$(dirname "$0")/find_python.sh"
    find_python
    set -- "$PYTHON" -m gpt.bench model --sizes gpt2 --seq-len 1024 --batch-size 8 \
        --modes step --precision bf16 --compile off --warmup 5 --steps 10 --nvtx \
        --out profiles --name "$(basename "$output")_bench"
fi

nsys_bin="${NSYS:-nsys}"
if ! command -v "$nsys_bin" >/dev/null 2>&1; then
    echo "error: '$nsys_bin' not found: install Nsight Systems (https://developer.nvidia.com/nsight-systems)" \
         "or set NSYS=/path/to/nsys" >&2
    exit 127
fi

capture_end="${NSYS_CAPTURE_END:-stop}"
extra=()
if [[ -n "${NSYS_EXTRA_ARGS:-}" ]]; then
    read -r -a extra <<<"$NSYS_EXTRA_ARGS"
fi

mkdir -p "$(dirname "$output")"
echo "nsys: writing $output.nsys-rep; profiling: $*" >&2
exec "$nsys_bin" profile \
    --trace=cuda,nvtx,osrt,cudnn,cublas \
    --capture-range=cudaProfilerApi \
    --capture-range-end="$capture_end" \
    --cuda-memory-usage=true \
    --output="$output" \
    --force-overwrite=true \
    ${extra[@]+"${extra[@]}"} \
    "$@"
