"""What the controller (`ebb.coldstart`) and a runner (`ebb.runners`) agree on about a launch.

Below both packages, so that neither imports the other for it: the cold-start tiers
(`tiers.py`), the pre-warmed stem pools and the GPUs one runner asks for (`stem_pools.py`),
and what a launcher hands a runner process in its environment (`handoff.py`).
"""
