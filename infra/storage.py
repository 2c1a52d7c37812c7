"""Storage: FSx for Lustre in the node subnet, optionally backed by an S3 data repository.

BeeGFS mode creates no resource: the storage targets are RAM disks on the workers, and what the launcher
sets up (RAM-disk size, roles) is recorded by :func:`infra.layout.beegfs_layout` in the stack outputs.
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from constructs import Construct

from infra.layout import FSX_MOUNT_POINT

# SCRATCH_2: no replication and no backups, 200 MB/s per TiB baseline with bursts; the cheapest Lustre for
# a cluster that lives hours and keeps its source of truth in S3. Lustre 2.15 is what current Ubuntu 22.04
# and 24.04 Lustre clients mount.
DEPLOYMENT_TYPE = "SCRATCH_2"
LUSTRE_VERSION = "2.15"
MOUNT_OPTIONS = "relatime,flock"


class LustreStorage(Construct):
    """One FSx for Lustre file system; with ``data_bucket`` it lazily imports that bucket's objects."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        capacity_gib: int,
        data_bucket: str | None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.capacity_gib = capacity_gib
        self.data_repository = f"s3://{data_bucket}" if data_bucket else None
        self.file_system = fsx.CfnFileSystem(
            self,
            "FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version=LUSTRE_VERSION,
            storage_type="SSD",
            storage_capacity=capacity_gib,
            subnet_ids=[subnet.subnet_id],
            security_group_ids=[security_group.security_group_id],
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type=DEPLOYMENT_TYPE,
                data_compression_type="LZ4",
                import_path=self.data_repository,
                # New and changed objects in the bucket appear in the file system while it lives.
                auto_import_policy="NEW_CHANGED_DELETED" if self.data_repository else None,
            ),
        )
        # Scratch data lives exactly as long as the cluster: the TTL guard's stack deletion removes it.
        self.file_system.apply_removal_policy(RemovalPolicy.DESTROY)

    def mount(self) -> dict[str, object]:
        """What a node needs to mount it (values may be deploy-time tokens): the ``StorageMount`` output.

        ``data_repository`` is left out without a data bucket (the stack's JSON rendering drops nulls).
        """
        return {
            "type": "fsx",
            "file_system_id": self.file_system.ref,
            "dns_name": self.file_system.attr_dns_name,
            "mount_name": self.file_system.attr_lustre_mount_name,
            "mount_point": FSX_MOUNT_POINT,
            "mount_options": MOUNT_OPTIONS,
            "capacity_gib": self.capacity_gib,
            "deployment_type": DEPLOYMENT_TYPE,
            "data_repository": self.data_repository,
        }
