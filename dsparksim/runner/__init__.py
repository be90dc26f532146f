"""Real runs on torch: a batched speculative-decoding engine driven by the simulator's own scheduler and
policies (:mod:`.engine`, :mod:`.executor`, :mod:`.flat`), real runs with the simulator's result files
(:mod:`.run`), the profiler (:mod:`.measure`), simulator-vs-real validation (:mod:`.validate`) and the
distribution audit (:mod:`.audit`). Imports torch; the simulator core never imports this package."""
