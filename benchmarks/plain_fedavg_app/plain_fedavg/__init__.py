"""Plain FedAvg on the offline digits: the deployment benchmark's baseline."""
