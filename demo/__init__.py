"""What a user runs to see the project work without a GPU cluster: the simulator and demo."""
