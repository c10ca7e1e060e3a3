export PYTHONPATH=. TRITON_CACHE_DIR=/tmp/tc PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/mpl
cp benchmarks/results/h200.json $OUT/h200.json
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw --format=csv
timeout 150 python3 -m pytest -q -m gpu tests/test_graph_gpu.py -p no:cacheprovider -p no:logging 2>&1 | tail -5
timeout 100 python3 benchmarks/run.py --suite graph --dtypes bfloat16 --warmup 5 --rep 30 --out $OUT --results $OUT/h200.json 2>&1 | grep -E "^\||rror" | tail -12
(export TRITON_CACHE_DIR=$(mktemp -d); timeout 150 python3 -m opendnn warmup --model torchvision:resnet50 --input 64x3x224x224 --dtype bfloat16 --channels-last --jobs 16 --step 2>&1 | tail -8)
timeout 170 python3 benchmarks/run.py --suite convolution_networks --dtypes bfloat16 --warmup 3 --rep 20 --out $OUT --results $OUT/h200.json 2>&1 | grep -E "^\||rror" | tail -45
