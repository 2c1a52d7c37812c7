"""Pure decisions about a node's network interfaces and the BeeGFS roles, shared by the stack and the launcher.

Nothing here imports aws-cdk-lib: the launcher reads the same layout to set ``FI_PROVIDER``/NCCL devices, and the
tests check it without synthesizing anything.

EFA layout (Amazon EC2 User Guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network cards",
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html, the basic configuration, as of
November 2026):

- the primary interface sits on network card 0, device index 0, and is an EFA *with* ENA: it carries the node's
  one private IP address (SSH, MPI's TCP bootstrap, S3, the VPC endpoints) and an EFA device (the page's basic
  configuration puts a plain ENA interface there and an ``efa-only`` one at card 0, device index 1: the same one
  address and one EFA device on card 0; an EFA-only interface can never be the primary);
- every other network card gets one interface of type ``efa-only``: an EFA device with no IP address, at device
  index **0** ("For each additional network interface, use the next unused network card index, device index 0, for
  EFA-only network interface, and/or device index 1 for ENA network interface"). AWS introduced EFA-only
  interfaces (October 2024, every EFA instance type) so that a p5 does not take 32 addresses from the subnet and
  Linux does not see 32 ENA devices in one subnet, whose source-address routing drops packets. NCCL (aws-ofi-nccl)
  uses EFA devices, not IP addresses, so all cards still carry collective traffic: p4d 4 devices (400 Gbps), p5 32
  (3,200 Gbps), p5en 16 (3,200 Gbps).

A type without EFA, or a node group that does not use it, gets one ordinary interface.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from infra.catalog import InstanceType

__all__ = [
    "BEEGFS_MOUNT_POINT",
    "BEEGFS_RAMDISK_FRACTION",
    "FSX_MOUNT_POINT",
    "Interface",
    "beegfs_layout",
    "efa_device_count",
    "interfaces",
]

InterfaceType = Literal["interface", "efa", "efa-only"]


class Interface(NamedTuple):
    """One network interface of a launch template."""

    network_card_index: int
    device_index: int
    interface_type: InterfaceType

    def as_dict(self) -> dict[str, int | str]:
        return self._asdict()


def interfaces(instance: InstanceType, *, efa: bool) -> tuple[Interface, ...]:
    """The interfaces a node of ``instance`` gets: the EFA layout above, or one plain interface."""
    if not efa:
        return (Interface(0, 0, "interface"),)
    if not instance.has_efa:
        raise ValueError(f"{instance.name} has no EFA network cards")
    primary = Interface(0, 0, "efa")
    # Device index 0 on cards 1..N: the EFA-only interface is each of those cards' first (see the module's notes).
    return (primary, *(Interface(card, 0, "efa-only") for card in range(1, instance.efa_cards)))


def efa_device_count(layout: tuple[Interface, ...]) -> int:
    """EFA devices (``rdmap*``) a node with this layout shows libfabric; 0 = TCP only."""
    return sum(1 for i in layout if i.interface_type in ("efa", "efa-only"))


# --- Shared storage --------------------------------------------------------------------------------------

FSX_MOUNT_POINT = "/fsx"
BEEGFS_MOUNT_POINT = "/beegfs"
BEEGFS_RAMDISK_PATH = "/mnt/beegfs-ramdisk"
# Share of a worker's memory given to its BeeGFS storage target (tmpfs). The rest stays for the trainer, its
# data-loader workers and the page cache; a quarter of 8 x p3.16xlarge (8 x 122 GiB = 976 GiB) holds the
# ~150 GB ImageNet training shards several times over, and 2 nodes already hold them once.
BEEGFS_RAMDISK_FRACTION = 0.25


def beegfs_layout(worker: InstanceType, *, reducers: int) -> dict[str, object]:
    """What the launcher sets up in BeeGFS mode, as recorded in the ``StorageMount`` output.

    Roles name nodes as ``ROLE:INDEX`` (``worker:0`` is the first worker in ascending private IPv4 order, the
    order the launcher lists nodes in) or ``ROLE:*`` for every node of that role. Workers hold the storage
    targets because their memory is the large pool; reducers, when present, only mount the file system.
    """
    clients = ["worker:*", "reducer:*"] if reducers else ["worker:*"]
    return {
        "type": "beegfs",
        "mount_point": BEEGFS_MOUNT_POINT,
        "ramdisk_path": BEEGFS_RAMDISK_PATH,
        "ramdisk_gib_per_node": int(worker.memory_gib * BEEGFS_RAMDISK_FRACTION),
        "roles": {
            "management": ["worker:0"],
            "metadata": ["worker:0"],
            "storage": ["worker:*"],
            "client": clients,
        },
    }
