"""Compute: one node group (launch template + Auto Scaling group) per role, in the cluster placement group."""

from __future__ import annotations

from aws_cdk import Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.catalog import InstanceType

ROOT_DEVICE = "/dev/sda1"  # the Ubuntu Deep Learning Base AMI's root device
ROOT_VOLUME_GIB = 200  # the image is ~100 GiB with CUDA stacks; room for logs, checkpoints and pip caches
TAG_CLUSTER = "scaletrain:cluster"
TAG_ROLE = "scaletrain:role"


def network_interfaces(
    instance: InstanceType, security_group_id: str
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """The interface layout AWS documents for multi-card EFA instances (p4d: 4 cards, p5: 32, p5en: 16).

    One EFA interface per network card; card 0 carries the primary interface (device index 0) and every
    other card's EFA interface takes device index 1. No public IPs: AWS refuses them on instances with
    several interfaces, and nothing here should be reachable from the internet anyway. Types without EFA
    get one ordinary interface.
    """
    common = {"groups": [security_group_id], "associate_public_ip_address": False, "delete_on_termination": True}
    if not instance.has_efa:
        return [ec2.CfnLaunchTemplate.NetworkInterfaceProperty(device_index=0, **common)]
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            network_card_index=card, device_index=0 if card == 0 else 1, interface_type="efa", **common
        )
        for card in range(instance.efa_cards)
    ]


class NodeGroup(Construct):
    """``nodes`` instances of one role, all in one subnet and the cluster placement group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        role: str,
        instance: InstanceType,
        nodes: int,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        placement_group: ec2.CfnPlacementGroup,
        image_id: str,
        spot: bool,
        capacity_reservation_id: str | None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"scaletrain {cluster_name} {role} nodes",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")],
        )
        NagSuppressions.add_resource_suppressions(
            self.role,
            [
                {
                    "id": "AwsSolutions-IAM4",
                    "reason": "AmazonSSMManagedInstanceCore is the AWS-maintained minimum for SSM-managed nodes",
                }
            ],
        )
        profile = iam.CfnInstanceProfile(self, "InstanceProfile", roles=[self.role.role_name])

        capacity = (
            ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=capacity_reservation_id
                )
            )
            if capacity_reservation_id
            else None
        )
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                image_id=image_id,
                instance_type=instance.name,
                iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(arn=profile.attr_arn),
                network_interfaces=network_interfaces(instance, security_group.security_group_id),
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=2
                ),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name=ROOT_DEVICE,
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=ROOT_VOLUME_GIB,
                            volume_type="gp3",
                            encrypted=True,
                            delete_on_termination=True,
                        ),
                    )
                ],
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
                capacity_reservation_specification=capacity,
                tag_specifications=[
                    ec2.CfnLaunchTemplate.TagSpecificationProperty(
                        resource_type=resource_type,
                        tags=[
                            {"key": TAG_CLUSTER, "value": cluster_name},
                            {"key": TAG_ROLE, "value": role},
                        ],
                    )
                    # Instances get these tags from the Auto Scaling group (Tags.of below, propagated at launch).
                    for resource_type in ("volume", "network-interface")
                ],
            ),
        )

        template_spec = autoscaling.CfnAutoScalingGroup.LaunchTemplateSpecificationProperty(
            launch_template_id=self.launch_template.ref,
            version=self.launch_template.attr_latest_version_number,
        )
        mixed = (
            autoscaling.CfnAutoScalingGroup.MixedInstancesPolicyProperty(
                launch_template=autoscaling.CfnAutoScalingGroup.LaunchTemplateProperty(
                    launch_template_specification=template_spec,
                    overrides=[
                        autoscaling.CfnAutoScalingGroup.LaunchTemplateOverridesProperty(instance_type=instance.name)
                    ],
                ),
                instances_distribution=autoscaling.CfnAutoScalingGroup.InstancesDistributionProperty(
                    on_demand_base_capacity=0,
                    on_demand_percentage_above_base_capacity=0,
                    spot_allocation_strategy="capacity-optimized",
                ),
            )
            if spot
            else None
        )
        size = str(nodes)
        self.group = autoscaling.CfnAutoScalingGroup(
            self,
            "Group",
            min_size=size,
            max_size=size,
            desired_capacity=size,
            vpc_zone_identifier=[subnet.subnet_id],
            placement_group=placement_group.ref,
            launch_template=None if spot else template_spec,
            mixed_instances_policy=mixed,
            tags=[
                autoscaling.CfnAutoScalingGroup.TagPropertyProperty(
                    key="Name", value=f"{cluster_name}-{role}", propagate_at_launch=True
                ),
            ],
        )
        NagSuppressions.add_resource_suppressions(
            self.group,
            [
                {
                    "id": "AwsSolutions-AS3",
                    "reason": "fixed-size group (min = max = desired); the launcher reads its state, no one subscribes",
                }
            ],
        )
        Tags.of(self).add(TAG_CLUSTER, cluster_name)
        Tags.of(self).add(TAG_ROLE, role)
