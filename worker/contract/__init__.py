"""The wire contract: messages, the error catalogue, and the documents made from them."""
