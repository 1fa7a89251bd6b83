"""Training on top of a ProcessGroup: DataParallel (data_parallel.py) and ElasticTrainer
(elastic.py). Both need torch."""
