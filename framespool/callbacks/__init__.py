"""Job callbacks: the target policy shared by request validation and webhook delivery."""
