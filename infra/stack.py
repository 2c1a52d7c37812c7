"""The cluster stack: composes network, security and compute from one ClusterSpec."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, CfnParameter, Stack, Tags
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from infra.compute import TAG_CLUSTER, NodeGroup
from infra.network import Network
from infra.security import NodeSecurity
from infra.spec import ClusterSpec

# The AWS Deep Learning Base AMI (OSS NVIDIA driver, EFA, NCCL, aws-ofi-nccl), resolved by CloudFormation
# at deploy time from its public SSM parameter; synth never looks it up. V100 types (p3) need the
# proprietary driver: pass -c ami=... or override the parameter for them.
DEEP_LEARNING_BASE_AMI_PARAMETER = (
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
)


class ClusterStack(Stack):
    """One training cluster: a private single-AZ network and a worker node group in a cluster placement group."""

    def __init__(self, scope: Construct, construct_id: str, *, spec: ClusterSpec, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, description=f"scaletrain cluster {spec.cluster_name}", **kwargs)
        self.spec = spec
        Tags.of(self).add(TAG_CLUSTER, spec.cluster_name)

        network = Network(self, "Network", az=spec.az)
        security = NodeSecurity(
            self, "Security", vpc=network.vpc, endpoints=network.interface_endpoints, ssh_cidr=spec.ssh_cidr
        )
        # One cluster placement group for every role, so later reducers sit beside the workers.
        placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")

        if spec.ami is not None:
            image_id = spec.ami
        else:
            image_id = CfnParameter(
                self,
                "DeepLearningAmi",
                type="AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>",
                default=DEEP_LEARNING_BASE_AMI_PARAMETER,
                description="SSM parameter naming the node image (resolved at deploy time)",
            ).value_as_string

        self.workers = NodeGroup(
            self,
            "Workers",
            cluster_name=spec.cluster_name,
            role="worker",
            instance=spec.worker,
            nodes=spec.nodes,
            subnet=network.subnet,
            security_group=security.group,
            placement_group=placement_group,
            image_id=image_id,
            spot=spec.spot,
            capacity_reservation_id=spec.capacity_reservation_id,
        )

        outputs = {
            "ClusterName": (spec.cluster_name, "cluster name (the scaletrain:cluster tag)"),
            "NodeGroupName": (self.workers.group.ref, "Auto Scaling group of the worker nodes"),
            "EfaDevicesPerNode": (str(spec.efa_devices_per_node), "EFA interfaces per worker; 0 = TCP only"),
            "InstanceType": (spec.instance_type, "worker instance type"),
            "Storage": (spec.storage, "shared storage: fsx, beegfs or none"),
        }
        for name, (value, description) in outputs.items():
            CfnOutput(self, name, value=value, description=description)
