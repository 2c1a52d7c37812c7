"""Security: the node group, its paths to the VPC endpoints, and the FSx for Lustre group."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Annotations
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

HTTPS = ec2.Port.tcp(443)
# Lustre's LNet port and the ports its servers and clients connect from
# (https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html).
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))


class NodeSecurity(Construct):
    """One group for every node: all traffic to and from itself, HTTPS out, nothing in from outside the group.

    No SSH ingress from anywhere: the VPC has no internet gateway, so an address outside it could never reach
    port 22 whatever a rule allowed. Operators reach nodes through SSM Session Manager over the VPC's interface
    endpoints (HTTPS out), and the nodes reach each other over the group's own traffic.

    EFA requires a group whose inbound AND outbound rules allow all traffic to and from the group
    itself; without the outbound rule the EFA provider fails and NCCL silently falls back to TCP. Workers and
    reducers share the group, so MPI, NCCL, BeeGFS and the reducers' traffic all pass the same rules.

    With ``fsx`` a second group guards the file system: Lustre ports from the nodes and from itself, and the
    node group may reach it (and be called back by it) on those ports only.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        endpoints: Sequence[ec2.InterfaceVpcEndpoint],
        fsx: bool,
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

        self.storage_group: ec2.SecurityGroup | None = None
        if fsx:
            # Outbound stays open: the file system's own traffic (to S3 for its data repository, to its
            # peers) is AWS's to manage, and the subnet has no route beyond the VPC and the S3 endpoint.
            self.storage_group = ec2.SecurityGroup(
                self,
                "Storage",
                vpc=vpc,
                description="scaletrain FSx for Lustre: Lustre ports from the nodes and itself",
                allow_all_outbound=True,
            )
            # allow_internally adds an egress rule too; with all outbound allowed it is redundant, not lost.
            Annotations.of(self.storage_group).acknowledge_warning(
                "@aws-cdk/aws-ec2:ipv4IgnoreEgressRule", "all outbound traffic is allowed on the FSx group"
            )
            for port in LUSTRE_PORTS:
                self.storage_group.connections.allow_internally(port, "Lustre between file servers")
                # Ingress on the file system from the nodes, plus the nodes' matching egress.
                self.storage_group.connections.allow_from(self.group, port, "Lustre from the nodes")
                self.group.connections.allow_from(self.storage_group, port, "Lustre callbacks from FSx")
