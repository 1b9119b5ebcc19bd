#!/usr/bin/env bash
# session 21 call 1: GPU trainer tests (worker death, checkpoint, resume); the 30-epoch CLI x3; snapshot A/B
set -uo pipefail
PART=tests K="checkpoint or resume or train_loop or async or fault or worker or snapshot" T=200 WORKERS=3 bash scripts/gpu-session.sh > /dev/null 2>&1
rm -f $OUT/gpu-tests.xml $OUT/json.tgz; tail -6 $OUT/gpu-tests.log
PYTHONPATH=. timeout 60 python3 .gpu/s21_snap_ab.py > $OUT/snap-ab.txt 2>&1; cat $OUT/snap-ab.txt
PART=cli CLI_ARMS="plain plain plain" T_CLI=80 bash scripts/gpu-session.sh > /dev/null 2>&1
grep -h -A6 "^time:" $OUT/train-cli-*.log; grep -h "process wall\|captured steps\|cli .* rc" $OUT/train-cli-*.log
for f in $OUT/train-cli-*.csv; do python3 -c "
import csv
r=list(csv.DictReader(open('$f')))
e=[float(x['time/epoch_s']) for x in r]
print('$f'.split('/')[-1], 'epochs %.2f (median %.3f) mAP %s' % (sum(e), sorted(e)[15], r[-1]['metrics/mAP50-95']))"; done
cd $OUT && tar czf cli.tgz train-cli-* train.log && rm -f train-cli-*
