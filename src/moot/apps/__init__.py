"""Applications built on the engine: the RAG debate step (seed 000), arbitration of contradicting
agent reports (seed 003)."""
