"""Failures, checkpoints, spares, stragglers and goodput: the cluster as it behaves.

rates: failure rates by class with their sources; blast: what each part's failure takes
down (from the graph); interruptions: a job's interruption rate and MTTI; checkpoint:
Young's and Daly's intervals and the expected run time under failures; recovery: what each
recovery strategy costs; goodput: the analytical goodput and badput of a run; montecarlo:
the same run simulated; spares: spare nodes against running smaller; stragglers: slow ranks,
degraded links, jitter and their mitigations; sizing: goodput across cluster sizes; adapter:
the one place that reads commsim.step's predictions.
"""
