"""Training on top of a ProcessGroup: DataParallel (data_parallel.py), ElasticTrainer
(elastic.py, with group_changes.py and progress.py) and the trainer state it sends to joiners
(state.py). All need torch."""
