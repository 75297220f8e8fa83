"""opendrs — an open Distributed Resource Scheduler for Proxmox VE and Incus clusters."""

__version__ = "0.1.0"
