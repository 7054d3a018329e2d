"""The worker process: the account flow, its decision, the executor and provider calls."""
