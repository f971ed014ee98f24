"""What a collective costs: the algorithms (algorithms/, one module each), their closed
forms and flows on the graph (evaluate), choice of algorithm (select, nccl), a placed
group's cached costs (group), and what each backend runs (backends)."""
