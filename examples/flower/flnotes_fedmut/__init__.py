"""FedMut on Flower: flnotes' strategy and local training as a Flower app."""
