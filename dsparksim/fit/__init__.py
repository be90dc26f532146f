"""Learning cost profiles from serving benchmarks (``dsparksim profile fit``): step traces, exact re-pricing, the
bounded least-squares fit with its identifiability, bootstrap and leave-one-concurrency-out checks."""
