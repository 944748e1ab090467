"""AOCS under SecAgg+ against AOCS in the clear, on one federation (a test app)."""
