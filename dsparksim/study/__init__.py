"""Studies (issue 29): questions the DSpark paper leaves open, answered with paired-seed intervals.

Each study module defines NAME, TITLE, QUESTION, ``plan(settings) -> cells``, ``measure(cell) -> row`` (one
simulated run reduced to its metrics; module-level so a process pool can run it) and ``analyse(settings, rows) ->
Section``. ``dsparksim study NAME|all --out DIR`` runs them (dsparksim.study.run) and regenerates DIR/REPORT.md.
"""
STUDIES = {"load-spikes": "dsparksim.study.spikes", "calibration-drift": "dsparksim.study.drift",
           "long-context": "dsparksim.study.longctx", "p99-tails": "dsparksim.study.tails",
           "early-exit": "dsparksim.study.early_exit", "ablation": "dsparksim.study.ablation",
           "fig8-production": "dsparksim.study.fig8"}
