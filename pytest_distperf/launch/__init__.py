"""From the pytest process to the ranks: job folders, torch elastic, devices and their allocation."""
