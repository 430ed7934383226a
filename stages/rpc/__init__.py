"""RPC measurement: a tracker keeps devices by key and a job queue, agents pull jobs, clients submit batches."""
