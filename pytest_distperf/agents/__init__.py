"""The processes between pytest and the ranks: torch elastic's agent, the warm agent its job agents fork from, a
node's torchrun agent, and the script agent of a job launched as its framework's users launch it."""
