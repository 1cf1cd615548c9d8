#!/bin/sh
# `make demo`: the embedded default. Synthesizes a tiny DeepSeek-V4-Flash-shaped model (the
# official checkpoint layout, random but sane weights, a small tokenizer), then streams a short
# answer from it and prints the run report. A synthetic model writes gibberish: the point is that
# every stage of the real pipeline runs.
set -e
DS4F=${1:-build/ds4f}
MODEL=${DS4F_DEMO_MODEL:-build/demo-model}
if [ ! -f "$MODEL/config.json" ]; then
    "$DS4F" synth "$MODEL" --preset tiny --seed 1
fi
"$DS4F" inspect "$MODEL"
echo
"$DS4F" run -m "$MODEL" -p "Explain RAID 5 in one paragraph." -n 48 --seed 1
