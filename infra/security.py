"""Security: the node group's one security group and its paths to the VPC endpoints."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_ec2 as ec2
from constructs import Construct

HTTPS = ec2.Port.tcp(443)


class NodeSecurity(Construct):
    """One group for every node: all traffic to and from itself, HTTPS out, SSH in only from ``ssh_cidr``.

    EFA requires a group whose inbound AND outbound rules allow all traffic to and from the group
    itself; without the outbound rule the EFA provider fails and NCCL silently falls back to TCP.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        endpoints: Sequence[ec2.InterfaceVpcEndpoint],
        ssh_cidr: str | None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.group = ec2.SecurityGroup(
            self,
            "Nodes",
            vpc=vpc,
            description="scaletrain nodes: EFA self-traffic, HTTPS to endpoints",
            allow_all_outbound=False,
        )
        self.group.add_ingress_rule(self.group, ec2.Port.all_traffic(), "EFA and MPI between nodes")
        self.group.add_egress_rule(self.group, ec2.Port.all_traffic(), "EFA and MPI between nodes")
        for endpoint in endpoints:
            # Adds the node group's egress rule and the endpoint group's ingress rule together.
            self.group.connections.allow_to(endpoint, HTTPS, "HTTPS to the VPC interface endpoints")
        # The subnet routes only to the S3 gateway endpoint, so HTTPS "anywhere" reaches S3 alone; the S3
        # prefix list id differs per region and naming it would need a synth-time lookup.
        self.group.add_egress_rule(ec2.Peer.any_ipv4(), HTTPS, "HTTPS to S3 via the gateway endpoint")
        if ssh_cidr is not None:
            self.group.add_ingress_rule(ec2.Peer.ipv4(ssh_cidr), ec2.Port.tcp(22), "SSH from ssh_cidr")
