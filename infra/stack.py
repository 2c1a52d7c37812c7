"""The cluster stack: composes network, security, compute, reducers, storage and the cost guard from one spec.

Outputs the launcher reads (``aws cloudformation describe-stacks``) are listed with their meaning in
``infra/README.md``; structured ones (``NodeGroups``, ``EfaDevices``, ``StorageMount``) are one JSON document each.

Stateful resources keep fixed logical IDs (:data:`PINNED_LOGICAL_IDS`), so refactoring constructs never
replaces a file system, a node group or the TTL clock.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import CfnOutput, CfnParameter, CfnResource, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from constructs import Construct, IConstruct

from ami import paths
from infra import boot, layout, ttl
from infra.compute import TAG_CLUSTER, NodeGroup, NodeIdentity
from infra.guard import CostGuard, IdleStop
from infra.head import HeadNode, MungeKey
from infra.layout import FSX_MOUNT_POINT, Interface
from infra.loggroups import give_functions_log_groups
from infra.network import Network
from infra.security import NodeSecurity
from infra.spec import ClusterSpec
from infra.storage import LustreStorage
from launcher.plans import slurm

# The node image defaults to the project's own (ami/: the trainer's venv, Horovod, BeeGFS, EFA, NCCL, ...), whose
# pipeline publishes its id to an SSM parameter (spec.image_parameter). CloudFormation resolves it at deploy time
# (an AWS::SSM::Parameter::Value<AWS::EC2::Image::Id> parameter:
# https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/parameters-section-structure.html, "SSM parameter
# types"); synth never looks it up. A stock image would not do: the node subnet cannot install anything at boot.
IMAGE_PARAMETER_ID = "NodeImage"

PINNED_LOGICAL_IDS = (
    "PlacementGroup",
    "WorkerGroup",
    "ReducerGroup",
    "FileSystem",
    "FlowLogGroup",
    "GuardLogGroup",
    "CustomVpcRestrictDefaultSGCustomResourceProviderLogGroup",  # CDK's provider's (infra/loggroups.py)
    "TtlClock",
    "TtlExpiry",
    "TtlSchedule",
    "HeadNode",  # slurmctld's state (the queue, the jobs' records) lives on its disk
    "MungeKey",  # a new key would lock out every running node
)


def _pin(construct: IConstruct, logical_id: str) -> None:
    resource = construct if isinstance(construct, CfnResource) else construct.node.default_child
    assert isinstance(resource, CfnResource), f"{construct.node.path} has no CloudFormation resource to pin"
    resource.override_logical_id(logical_id)


def _compact_json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _devices(layout: tuple[Interface, ...]) -> list[dict[str, int | str]]:
    return [interface.as_dict() for interface in layout]


class ClusterStack(Stack):
    """One training cluster: private single-AZ network, workers (and reducers) in one placement group, the Slurm
    head node they register with, shared storage, and a cost guard that deletes it all after ``ttl_hours``."""

    def __init__(self, scope: Construct, construct_id: str, *, spec: ClusterSpec, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, description=f"scaletrain cluster {spec.cluster_name}", **kwargs)
        self.spec = spec
        Tags.of(self).add(TAG_CLUSTER, spec.cluster_name)

        network = Network(self, "Network", az=spec.az)
        _pin(network.flow_log_group, "FlowLogGroup")
        security = NodeSecurity(
            self,
            "Security",
            vpc=network.vpc,
            endpoints=network.interface_endpoints,
            fsx=spec.storage == "fsx",
        )

        # One cluster placement group for every role, so reducers sit beside the workers; or the user's own
        # (a capacity reservation made in a cluster placement group must be used from that group); or none with a
        # Capacity Block, which places its instances together itself (spec.placement).
        placement_group_name: str | None = None
        if spec.placement == "new":
            placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            _pin(placement_group, "PlacementGroup")
            placement_group_name = placement_group.ref
        elif spec.placement == "given":
            placement_group_name = spec.placement_group

        image_id = spec.ami if spec.ami is not None else self._image_parameter(spec)
        identity = NodeIdentity(
            self,
            "NodeIdentity",
            cluster_name=spec.cluster_name,
            data_bucket=spec.data_bucket,
            checkpoint_bucket=spec.checkpoint_bucket,
            checkpoint_prefix=spec.checkpoint_prefix,
            checkpoint_kms_key=spec.checkpoint_kms_key,
        )
        # Shared storage before the instances: with FSx, every instance's boot (the head node's and each node's, an
        # Auto Scaling replacement's too) mounts it from /etc/fstab before its Slurm daemon starts, so its user data
        # holds the file system's DNS and mount names (Fn::GetAtt), and CloudFormation creates the file system first.
        # BeeGFS lives on the workers' RAM disks and is set up by the launcher once they run (awsrun.prepare_storage).
        storage_mount: dict[str, object] = {"type": spec.storage}
        boot_storage: dict[str, object] | None = None  # what each instance's boot mounts itself
        file_system: fsx.CfnFileSystem | None = None
        if spec.storage == "fsx":
            assert security.storage_group is not None and spec.fsx_capacity is not None
            lustre = LustreStorage(
                self,
                "Lustre",
                subnet=network.subnet,
                security_group=security.storage_group,
                capacity_gib=spec.fsx_capacity,
                data_bucket=spec.data_bucket,
            )
            file_system = lustre.file_system
            _pin(file_system, "FileSystem")
            storage_mount = boot_storage = lustre.mount()
        elif spec.beegfs is not None:
            storage_mount = spec.beegfs

        # Slurm: the munge key every node reads at boot, and the head node running the controller.
        munge_key = MungeKey(self, "Munge", cluster_name=spec.cluster_name)
        _pin(munge_key.secret, "MungeKey")
        munge_key.allow_read(identity.role)
        self.head = HeadNode(
            self,
            "Head",
            cluster_name=spec.cluster_name,
            region=spec.region,
            subnet=network.subnet,
            security_group=security.group,
            image_id=image_id,
            root_device=spec.root_device,
            root_volume_gib=spec.root_volume_gib,
            munge_key=munge_key,
            max_nodes=boot.max_nodes(workers=spec.nodes, reducers=spec.reducers),
            storage=boot_storage,
            after=[network.secrets_endpoint],
        )
        _pin(self.head.instance, "HeadNode")

        def node_boot(role: str, vcpus: int) -> str:
            instance = spec.worker if role == "worker" else spec.reducer
            interfaces = spec.worker_interfaces if role == "worker" else spec.reducer_interfaces
            return boot.node_script(
                region=spec.region,
                secret_id=munge_key.secret.secret_arn,
                controller_addr=self.head.private_ip,
                role=role,
                cpus=vcpus,
                # The doctor's node checks as Slurm's HealthCheckProgram, against what this group was given: its
                # instance type's GPUs and driver, the EFA devices the stack attached (none on TCP), Horovod, MPI,
                # and FSx mounted and writable at /fsx: the node mounts it in its own boot, before slurmd starts and
                # runs the check, so a node (a replacement too) without it drains itself instead of taking a job.
                # Not BeeGFS: the launcher sets it up after boot (awsrun.prepare_storage), and slurmd runs the check
                # as it starts, so every node would drain itself before anything could mount it.
                health_check=slurm.health_check_argv(
                    python=paths.PYTHON, backend="aws", mpirun=paths.MPIRUN, instance_type=instance.name,
                    storage="fsx" if boot_storage else "none",
                    shared_mount=FSX_MOUNT_POINT if boot_storage else None,
                    efa_devices=layout.efa_device_count(interfaces)),
                storage=boot_storage,
            )

        common = {
            "cluster_name": spec.cluster_name,
            "subnet": network.subnet,
            "security_group": security.group,
            "placement_group_name": placement_group_name,
            "identity": identity,
            "image_id": image_id,
            "root_device": spec.root_device,
            "root_volume_gib": spec.root_volume_gib,
            "spot": spec.spot,
        }
        self.workers = NodeGroup(
            self,
            "Workers",
            role="worker",
            instance=spec.worker,
            nodes=spec.nodes,
            layout=spec.worker_interfaces,
            capacity_reservation_id=spec.capacity_reservation_id,
            capacity_block=spec.capacity_block,
            user_data=node_boot("worker", spec.worker.vcpus),
            **common,
        )
        _pin(self.workers.group, "WorkerGroup")
        self.reducers: NodeGroup | None = None
        if spec.reducers:
            # The capacity reservation is for the worker type; reducers launch on demand (or spot).
            self.reducers = NodeGroup(
                self,
                "Reducers",
                role="reducer",
                instance=spec.reducer,
                nodes=spec.reducers,
                layout=spec.reducer_interfaces,
                capacity_reservation_id=None,
                user_data=node_boot("reducer", spec.reducer.vcpus),
                **common,
            )
            _pin(self.reducers.group, "ReducerGroup")

        # A node scaletrain drained (a straggler, a short link) has its group replace it (launcher/doctor/health.py).
        identity.allow_marking_unhealthy(
            [self.workers.group.ref, *([self.reducers.group.ref] if self.reducers is not None else [])]
        )

        # The TTL counts from when the expensive resources exist, not from the start of the deploy.
        expensive: list[IConstruct] = [self.workers.group]
        if self.reducers is not None:
            expensive.append(self.reducers.group)
        if file_system is not None:
            expensive.append(file_system)
        guard = CostGuard(
            self,
            "Guard",
            ttl_hours=spec.ttl_hours,
            cluster_name=spec.cluster_name,
            schedule_name=f"{spec.cluster_name}-ttl",
            starts_after=expensive,
        )
        _pin(guard.log_group, "GuardLogGroup")
        _pin(guard.clock, "TtlClock")
        _pin(guard.parameter, "TtlExpiry")
        _pin(guard.schedule, "TtlSchedule")
        if spec.idle_minutes is not None:
            groups = [(self.workers.group.ref, ttl.idle_cpu_percent(spec.worker.vcpus))]
            if self.reducers is not None:
                groups.append((self.reducers.group.ref, ttl.idle_cpu_percent(spec.reducer.vcpus)))
            IdleStop(
                self,
                "Idle",
                idle_minutes=spec.idle_minutes,
                groups=groups,
                log_group=guard.log_group,
                starts_after=expensive,
            )

        node_groups = [
            {
                "role": "worker",
                "group_name": self.workers.group.ref,
                "instance_type": spec.instance_type,
                "nodes": spec.nodes,
                "transport": "efa" if spec.worker_efa else "tcp",
                "efa_devices": _devices(spec.worker_interfaces),
            }
        ]
        if self.reducers is not None:
            node_groups.append(
                {
                    "role": "reducer",
                    "group_name": self.reducers.group.ref,
                    "instance_type": spec.reducer_type,
                    "nodes": spec.reducers,
                    "transport": spec.reducer_transport,
                    "efa_devices": _devices(spec.reducer_interfaces),
                }
            )

        outputs: dict[str, tuple[str, str]] = {
            "ClusterName": (spec.cluster_name, "cluster name (the scaletrain:cluster tag)"),
            "InstanceType": (spec.instance_type, "worker instance type"),
            "NodeGroupName": (self.workers.group.ref, "Auto Scaling group of the worker nodes"),
            "ReducerGroupName": (
                self.reducers.group.ref if self.reducers else "none",
                "Auto Scaling group of the reducer nodes, or none",
            ),
            "NodeGroups": (self.to_json_string(node_groups), "JSON: one object per role"),
            "EfaDevicesPerNode": (str(spec.efa_devices_per_node), "EFA devices per worker; 0 = TCP only"),
            "EfaDevices": (_compact_json(_devices(spec.worker_interfaces)), "JSON: the worker's network interfaces"),
            "ReducerTransport": (
                spec.reducer_transport if spec.reducers else "none",
                "reducer-worker transport: efa, tcp, or none without reducers",
            ),
            "Storage": (spec.storage, "shared storage: fsx, beegfs or none"),
            "StorageMount": (self.to_json_string(storage_mount), "JSON: how nodes mount the shared storage"),
            "DataBucket": (spec.data_bucket or "none", "S3 bucket the nodes may read, or none"),
            "PlacementGroupName": (
                placement_group_name or "none",
                "cluster placement group of every node, or none (a Capacity Block places its nodes itself)",
            ),
            "TtlHours": (f"{spec.ttl_hours:g}", "hours from deploy until the cost guard deletes the stack"),
            "TtlExpiresAt": (guard.expires_at, "when the cost guard deletes the stack (UTC), as deployed"),
            "TtlParameterName": (
                guard.parameter_name,
                "SSM parameter holding the expiry the guard acts on; extending the TTL writes a later time to it "
                f"({' and '.join(ttl.EXTEND_PERMISSIONS)} on it; no iam:PassRole)",
            ),
            "TtlScheduleName": (guard.schedule_name, "EventBridge Scheduler schedule that runs the guard"),
            "TtlScheduleGroup": (guard.schedule_group, "schedule group of TtlScheduleName"),
            "IdleMinutes": (
                str(spec.idle_minutes) if spec.idle_minutes is not None else "none",
                "minutes of idle nodes (CPU below half a vCPU on every node) after which the stack deletes itself, "
                "or none",
            ),
            "HeadNode": (
                self.to_json_string(self.head.description()),
                "JSON: the Slurm head node (instance_id, private_ip, host_name, instance_type, slurmctld_port)",
            ),
            "ImageParameter": (
                spec.image_parameter or "none",
                "SSM parameter the node image was resolved from at deploy time, or none (-c ami=...)",
            ),
        }
        for name, (value, description) in outputs.items():
            CfnOutput(self, name, value=value, description=description)
        # Last, once every construct exists: CDK's own handlers (the VPC's Custom::VpcRestrictDefaultSG provider) get
        # a log group with a retention that goes with the stack, as the guard's functions have (infra/loggroups.py).
        for group in give_functions_log_groups(self):
            _pin(group, "".join(ch for ch in group.node.scope.node.id if ch.isalnum()) + "LogGroup")

    def _image_parameter(self, spec: ClusterSpec) -> str:
        """The project's image, resolved at deploy time from the parameter its pipeline publishes to.

        A parameter that does not exist (the image was never built in this region) fails the deploy before anything
        is created; the launcher's preflight says so in one line, naming the command in this description.
        """
        assert spec.image_parameter is not None
        return CfnParameter(
            self,
            IMAGE_PARAMETER_ID,
            type="AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
            default=spec.image_parameter,
            description=f"SSM parameter naming the node image, resolved at deploy time; `{spec.image_build_command}` "
            "builds the image and publishes it there. Pass -c ami=ami-... instead to use another image.",
        ).value_as_string
