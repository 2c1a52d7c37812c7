"""Network: one VPC in one AZ whose node subnet has no route to or from the internet."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

# Interface endpoints the SSM agent needs to register and to carry Session Manager sessions.
SSM_ENDPOINT_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "Ec2Messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
}
# Every node and the head node read the cluster's munge key from Secrets Manager at boot; with no route out of the
# subnet, only an interface endpoint reaches it (https://docs.aws.amazon.com/secretsmanager/latest/userguide/vpc-endpoint-overview.html).
SECRETS_ENDPOINT_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "SecretsManager": ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER,
}
# A node that scaletrain drained (a straggler under --on-straggler drain, a link short of the node check) marks its
# own instance Unhealthy (`aws autoscaling set-instance-health`, launcher/doctor/health.mark_unhealthy) and its group
# replaces it. From the isolated subnet only an interface endpoint reaches the Auto Scaling API ("Amazon EC2 Auto
# Scaling and interface VPC endpoints": com.amazonaws.REGION.autoscaling,
# https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-vpc-endpoints.html); without it the call
# found no route and hung until its deadline, and the drained node was never replaced (issue 46's fourth review).
AUTOSCALING_ENDPOINT_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "AutoScaling": ec2.InterfaceVpcEndpointAwsService.AUTOSCALING,
}
# Every interface endpoint the stack makes, by its construct id (launcher/plans/preflight_limits.ENDPOINT_INTERFACES
# counts their network interfaces; a test holds the two equal).
INTERFACE_ENDPOINT_SERVICES = {**SSM_ENDPOINT_SERVICES, **SECRETS_ENDPOINT_SERVICES, **AUTOSCALING_ENDPOINT_SERVICES}


class Network(Construct):
    """VPC, private isolated node subnet, S3 gateway endpoint, SSM, Secrets Manager and Auto Scaling interface
    endpoints and flow logs.

    No NAT gateway and no internet gateway: the image (the project's own, built by ami/, or ``ami``) carries the
    whole software stack, operators reach nodes through SSM Session Manager over the interface endpoints,
    and data comes from S3 over the gateway endpoint. Nothing in the node subnet can reach the internet
    or be reached from it, and there is no NAT to pay for by the hour.
    """

    def __init__(self, scope: Construct, construct_id: str, *, az: str | None) -> None:
        super().__init__(scope, construct_id)
        self.flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,  # the cluster is short-lived; its logs expire with it
        )
        # One AZ: a cluster placement group lives in one AZ. Without `az`, the region's first AZ is
        # chosen at deploy time (Fn::GetAZs), so synth needs no lookup.
        placement = {"availability_zones": [az]} if az else {"max_azs": 1}
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr("10.0.0.0/16"),
            nat_gateways=0,
            # /18 = 16,379 addresses. A node takes one (its primary interface; EFA-only interfaces have none),
            # so the subnet holds thousands of nodes plus the endpoints and FSx; with EFA-with-ENA on every card
            # 256 p5.48xlarge would take 8,192.
            subnet_configuration=[
                ec2.SubnetConfiguration(name="nodes", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=18)
            ],
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group),
                    traffic_type=ec2.FlowLogTrafficType.ALL,
                )
            },
            **placement,
        )
        self.subnet = self.vpc.isolated_subnets[0]
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        # open=False: the security construct admits HTTPS from the node group only.
        self.interface_endpoints: list[ec2.InterfaceVpcEndpoint] = [
            self.vpc.add_interface_endpoint(name, service=service, private_dns_enabled=True, open=False)
            for name, service in INTERFACE_ENDPOINT_SERVICES.items()
        ]
        self.secrets_endpoint = self.interface_endpoints[list(INTERFACE_ENDPOINT_SERVICES).index("SecretsManager")]
