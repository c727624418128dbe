"""Drop-ins for the planners other trainers ship (``verl``; OpenRLHF and others copy it)."""
