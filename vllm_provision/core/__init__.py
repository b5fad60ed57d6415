"""The core: errors, quoting, file writes, results, the inventory's model and paths; imports
nothing of the package above it."""
