"""Torch backend: trains a small target model and four drafters, runs exact speculative decoding and records the
real acceptance traces the simulator replays. Needs ``pip install 'dsparksim[torch]'``; the simulator core never
imports this package.

Modules: :mod:`.model` (target), :mod:`.drafters` (mtp1, eagle3, dflash, dspark), :mod:`.specdec` (exact
speculative decoding), :mod:`.calibration` (Sequential Temperature Scaling), :mod:`.data` / :mod:`.tokenizer`
(domains and BPE), :mod:`.train` (pipeline), :mod:`.collect` (traces), :mod:`.report` (quality report),
:mod:`.checkpoint`, :mod:`.config` (presets).
"""
