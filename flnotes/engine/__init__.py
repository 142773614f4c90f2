"""The engine: a config's task, trained round by round with a strategy, into a History.

``sim.run(config) -> History`` samples clients, dispatches the strategy's start states,
trains them (:mod:`flnotes.engine.backends` picks the reference loop or the batched vmap
backend), aggregates, evaluates and checkpoints; ``seeds.run_seeds`` runs several seeds
together. ``state`` holds the arithmetic on model states that every algorithm is written in.
"""
