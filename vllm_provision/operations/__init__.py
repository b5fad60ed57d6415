"""What commands do, above the pipeline's rooms: approval, plan, take-over, fleets, scaffolding."""
