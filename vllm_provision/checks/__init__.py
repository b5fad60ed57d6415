"""Pure rules from facts to findings: parity, topology, placement, network."""
