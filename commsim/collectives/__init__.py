"""What a collective costs: closed forms (alphabeta), flows on the graph (schedule), choice
of algorithm (select)."""
