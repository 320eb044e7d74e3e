"""The scheduler cycle: the loop, its leader election, the snapshot it reads, the store it
commits to, planning, fair share and runtime predictions."""
