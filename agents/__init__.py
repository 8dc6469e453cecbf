"""Node agent: registers, heartbeats, runs the generator, checkpoints, uploads.

``ledger`` holds the agent's decisions (on the purity list); ``agent`` and ``execution`` are
the shell around them; ``runner`` owns one generator process group;
``artifacts``, ``gpus`` and ``profiles`` are its ports and configuration;
``demo_generator`` is the bundled real generator.
"""
