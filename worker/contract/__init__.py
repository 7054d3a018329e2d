"""The wire contract: messages and the error catalogue (the documents made from them are in
``worker.documents``)."""
