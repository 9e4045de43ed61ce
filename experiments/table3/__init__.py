"""Table 3 (model variations) reproduced by config overrides, over seeds, judged by a fixed
protocol: `python -m experiments.table3 --help`.

  presets.py   the paper / small / gpu / micro settings of every row (small from configs/small.py),
               and the protocol's variants (twice the budget, a share of the pairs)
  commands.py  one `python -m tfm_jax ...` run, logged, retried once without the malloc tunables
  runner.py    one (row, seed): its workdir, train + evaluate + params, result.json as a cache
  sweep.py     the command line: rows x seeds, in order or --parallel, the report after each run
  stats.py     the pre-registered protocol and its statistics (pure functions over numbers)
  evidence.py  what a comparison's dev curves show when it did not come out as the paper's
  explain.py   the pre-registered explanation experiments, their runs and their outcomes
  rules.py     each explanation experiment's verdict rule as code (pure functions over results)
  replay.py    --bleu_at_best: BLEU at the best checkpoint for runs that kept only the latest
  machines.py  --machine_check: a finished run trained again here, to tell a machine's share of
               a pair's difference (in no rule)
  report.py    the markdown, CSVs and chart
  budget_plot.py  dev curves of budget runs (how the budget was chosen)
"""
