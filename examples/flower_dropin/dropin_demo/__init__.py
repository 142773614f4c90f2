"""A plain PyTorch Flower app (its own model and data) using flnotes' drop-in FedMut."""
