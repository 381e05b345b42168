"""One loader, validator and applier per model, shared by the replay CLI, the Playground and the tests."""
