"""Training on top of a ProcessGroup: DataParallel (data_parallel.py), ElasticTrainer
(elastic.py) and the trainer state it sends to joiners (state.py). All need torch."""
