"""Compute: the nodes' identity, and one node group (launch template + Auto Scaling group) per role.

Every node group launches into the one node subnet and, unless a Capacity Block places the nodes itself, the one
cluster placement group. The launch template carries what a node needs to train at full network speed on the first
try: one interface per EFA network card in the layout :mod:`infra.layout` decides, the node security group on every
interface, no public address, IMDSv2 only, an encrypted root volume of the image's own size (or larger), and the
boot script that joins it to the cluster's Slurm (:mod:`infra.boot`). The head node (:mod:`infra.head`) is launched
with the same :func:`instance_data`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Aws, Fn, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.catalog import InstanceType
from infra.layout import Interface

TAG_CLUSTER = "scaletrain:cluster"
TAG_ROLE = "scaletrain:role"
# IMDSv2 only; a hop limit of 2 lets a container on the node reach it too
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-new-instances.html).
IMDSV2 = ec2.CfnLaunchTemplate.MetadataOptionsProperty(
    http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=2
)


def network_interfaces(
    layout: Sequence[Interface], security_group_id: str
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """The launch template's interfaces for ``layout``, each in the node group and without a public address.

    ``AssociatePublicIpAddress`` is set (to false) only on a single interface: EC2 rejects the parameter
    (InvalidParameterCombination) when an instance launches with more than one network interface, whatever its
    value ("You cannot specify more than one network interface in the request":
    https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceNetworkInterfaceSpecification.html,
    AssociatePublicIpAddress). Leaving it out costs nothing: the node subnet is private and isolated, with
    ``MapPublicIpOnLaunch`` false, so no interface gets a public address. A plain single interface leaves
    ``NetworkCardIndex`` and ``InterfaceType`` at their defaults (card 0, ENA).
    """
    common: dict[str, object] = {"groups": [security_group_id], "delete_on_termination": True}
    if len(layout) == 1:
        common["associate_public_ip_address"] = False
    result = []
    for interface in layout:
        if interface.interface_type == "interface":
            result.append(ec2.CfnLaunchTemplate.NetworkInterfaceProperty(device_index=interface.device_index, **common))
        else:
            result.append(
                ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                    network_card_index=interface.network_card_index,
                    device_index=interface.device_index,
                    interface_type=interface.interface_type,
                    **common,
                )
            )
    return result


def instance_data(
    *,
    cluster_name: str,
    role: str,
    instance: InstanceType,
    identity: NodeIdentity,
    image_id: str,
    root_device: str,
    root_volume_gib: int | None,
    user_data: str,
    tagged: Sequence[str] = ("volume", "network-interface"),
) -> dict[str, Any]:
    """What every instance of the stack is launched with, node or head node, as launch template data: the image, the
    instance role, IMDSv2 only, an encrypted gp3 root of the image's size (or ``root_volume_gib``), detailed
    monitoring, the boot script ``user_data`` (text, base64-encoded here) and the cluster and role tags on the
    ``tagged`` resource types."""
    return {
        "image_id": image_id,
        "instance_type": instance.name,
        "iam_instance_profile": ec2.CfnLaunchTemplate.IamInstanceProfileProperty(arn=identity.profile.attr_arn),
        "metadata_options": IMDSV2,
        "block_device_mappings": [
            ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                device_name=root_device,
                # No size: the volume is the image's root snapshot's size, which is what the image was
                # built with (ami/ root_volume_gib), so any image launches. A size given must be at least
                # the snapshot's (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html,
                # VolumeSize: "the default is the snapshot size ... equal to or larger than the snapshot size").
                ebs=ec2.CfnLaunchTemplate.EbsProperty(
                    volume_size=root_volume_gib,
                    volume_type="gp3",
                    encrypted=True,
                    delete_on_termination=True,
                ),
            )
        ],
        "monitoring": ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
        # UserData is the script base64-encoded
        # (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RequestLaunchTemplateData.html, UserData).
        "user_data": Fn.base64(user_data),
        "tag_specifications": [
            ec2.CfnLaunchTemplate.TagSpecificationProperty(
                resource_type=resource_type,
                tags=[{"key": TAG_CLUSTER, "value": cluster_name}, {"key": TAG_ROLE, "value": role}],
            )
            for resource_type in tagged
        ],
    }


class NodeIdentity(Construct):
    """The role and instance profile every node uses: SSM Session Manager, read access to ``data_bucket``, and with
    ``checkpoint_bucket`` what ``launch train --checkpoint-to`` needs under ``checkpoint_prefix`` there; the stack
    adds reading the cluster's munge key (infra/head.py, ``MungeKey``).

    Nothing else: nodes cannot write to S3 outside that prefix, call other AWS APIs, or read any other bucket.
    The head node has an identity of its own (``purpose``), without the buckets.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        data_bucket: str | None,
        checkpoint_bucket: str | None = None,
        checkpoint_prefix: str = "",
        checkpoint_kms_key: str | None = None,
        purpose: str = "nodes",
    ) -> None:
        super().__init__(scope, construct_id)
        # AmazonSSMManagedInstanceCore: what the SSM agent needs for Session Manager, the launcher's only way in
        # (https://docs.aws.amazon.com/systems-manager/latest/userguide/setup-instance-permissions.html).
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"scaletrain {cluster_name} {purpose}",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")],
        )
        suppressions = [
            {
                "id": "AwsSolutions-IAM4",
                "reason": "AmazonSSMManagedInstanceCore is the AWS-maintained minimum for SSM-managed nodes",
                "appliesTo": ["Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore"],
            }
        ]
        if data_bucket is not None:
            bucket_arn = f"arn:{Aws.PARTITION}:s3:::{data_bucket}"
            self.role.add_to_policy(
                iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[bucket_arn])
            )
            self.role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"{bucket_arn}/*"]))
            suppressions.append(
                {
                    "id": "AwsSolutions-IAM5",
                    "reason": "read any object of the data bucket the user named, and only that bucket",
                    "appliesTo": [f"Resource::arn:<AWS::Partition>:s3:::{data_bucket}/*"],
                }
            )
        if checkpoint_bucket is not None:
            suppressions.append(self._grant_checkpoints(checkpoint_bucket, checkpoint_prefix))
        if checkpoint_kms_key is not None:
            self._grant_checkpoint_key(checkpoint_kms_key)
        NagSuppressions.add_resource_suppressions(self.role, suppressions, apply_to_children=True)
        self.profile = iam.CfnInstanceProfile(self, "InstanceProfile", roles=[self.role.role_name])

    def allow_marking_unhealthy(self, group_names: list[str]) -> None:
        """autoscaling:SetInstanceHealth on the stack's own Auto Scaling groups, and no other: a node that scaletrain
        drained (a straggler under --on-straggler drain, a link that fell short of the node check) marks its own
        instance Unhealthy from its health check (launcher/doctor/health.py), and its group replaces it.

        SetInstanceHealth takes the autoScalingGroup resource type, whose ARN is
        ``arn:${Partition}:autoscaling:${Region}:${Account}:autoScalingGroup:${GroupId}:autoScalingGroupName/${Name}``
        (Service Authorization Reference, "Actions, resources, and condition keys for Amazon EC2 Auto Scaling",
        https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2autoscaling.html). The
        group's id is a UUID AWS assigns at creation, which CloudFormation does not return (an
        AWS::AutoScaling::AutoScalingGroup has no Arn attribute), so it is the one wildcard; the names are the
        stack's groups.
        """
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["autoscaling:SetInstanceHealth"],
                resources=[
                    f"arn:{Aws.PARTITION}:autoscaling:{Aws.REGION}:{Aws.ACCOUNT_ID}:autoScalingGroup:*:"
                    f"autoScalingGroupName/{name}"
                    for name in group_names
                ],
            )
        )
        NagSuppressions.add_resource_suppressions(
            self.role,
            [
                {
                    "id": "AwsSolutions-IAM5",
                    "reason": "mark an instance of this stack's own Auto Scaling groups Unhealthy; the wildcard is "
                    "the group id AWS assigns, which CloudFormation does not return",
                    "appliesTo": [
                        {
                            "regex": "/^Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:"
                            "autoScalingGroup:\\*:autoScalingGroupName\\/<[A-Za-z0-9]+>$/g"
                        }
                    ],
                }
            ],
            apply_to_children=True,
        )

    def _grant_checkpoint_key(self, key_arn: str) -> None:
        """Use of the customer-managed KMS key the checkpoint bucket encrypts with (SSE-KMS), through S3 only.

        "To upload an object encrypted with an AWS KMS key to Amazon S3, you need kms:GenerateDataKey permissions on
        the key. To download an object encrypted with an AWS KMS key, you need kms:Decrypt permissions", and a
        multipart upload needs both (https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html,
        "Permissions"). Without them every PutObject the checkpoint copies make is AccessDenied however the bucket
        grant reads. ``kms:ViaService`` keeps the grant to requests S3 makes on the nodes' behalf in the key's Region
        (https://docs.aws.amazon.com/kms/latest/developerguide/conditions-kms.html#conditions-kms-via-service). The
        key's own policy must let this account's IAM policies grant it (the default key policy does; a key in
        another account must name the role in its key policy).
        """
        region = key_arn.split(":")[3]
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["kms:GenerateDataKey", "kms:Decrypt"],
                resources=[key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"s3.{region}.amazonaws.com"}},
            )
        )

    def _grant_checkpoints(self, bucket: str, prefix: str) -> dict[str, object]:
        """What training/durable.py's AWS CLI calls need on ``s3://bucket/prefix/``, and only there; returns the
        cdk-nag suppression for the prefix wildcard.

        The IAM action each S3 operation needs
        (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html, "API operations
        defined by Amazon S3" and "Actions defined by Amazon S3"):
        - ``aws s3 cp FILE s3://...`` (the checkpoint, then the marker from stdin): PutObject, and for a file above
          the CLI's 8 MiB multipart threshold CreateMultipartUpload, UploadPart and CompleteMultipartUpload, which
          are all authorized by s3:PutObject; a failed multipart upload is aborted by the CLI
          (AbortMultipartUpload: s3:AbortMultipartUpload), or its parts stay stored and billed;
        - ``aws s3 cp s3://... -`` / ``... FILE`` (the restore): HeadObject and GetObject, both s3:GetObject;
        - ``aws s3 rm`` of the old marker: DeleteObject, s3:DeleteObject (the bucket is not versioned by us;
          DeleteObjectVersion is not asked for);
        - ``aws s3api list-objects-v2 --prefix PREFIX/``: ListObjectsV2, s3:ListBucket on the bucket ARN, limited
          to that prefix with the s3:prefix condition key
          (https://docs.aws.amazon.com/AmazonS3/latest/userguide/amazon-s3-policy-keys.html, "Example: Limiting
          the list of objects to a specific prefix"; StringLike ``PREFIX/*`` matches ``PREFIX/`` itself).
        Object actions take the object ARN ``arn:aws:s3:::BUCKET/KEY``; ListBucket takes the bucket ARN
        (same page, "Resource types defined by Amazon S3").
        """
        bucket_arn = f"arn:{Aws.PARTITION}:s3:::{bucket}"
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[f"{bucket_arn}/{prefix}/*"],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[bucket_arn],
                conditions={"StringLike": {"s3:prefix": f"{prefix}/*"}},
            )
        )
        return {
            "id": "AwsSolutions-IAM5",
            "reason": "write, read and delete checkpoints under the one prefix the user named "
            "(launch train --checkpoint-to), and nowhere else",
            "appliesTo": [f"Resource::arn:<AWS::Partition>:s3:::{bucket}/{prefix}/*"],
        }


class NodeGroup(Construct):
    """``nodes`` instances of one role, all in one subnet and the cluster placement group.

    The group is fixed-size (min = max = desired = ``nodes``): CloudFormation resources do not grow with the
    node count, so 256 nodes synthesize to the same template as 8. Spot nodes come from a mixed-instances
    policy with 0% on-demand; a capacity reservation is targeted from the launch template.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        role: str,
        instance: InstanceType,
        nodes: int,
        layout: Sequence[Interface],
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        placement_group_name: str | None,
        identity: NodeIdentity,
        image_id: str,
        root_device: str,
        root_volume_gib: int | None,
        spot: bool,
        capacity_reservation_id: str | None,
        user_data: str,
        capacity_block: bool = False,
    ) -> None:
        """``root_volume_gib`` None: the image's root size; ``capacity_block``: the reservation is a Capacity Block;
        ``user_data``: the boot script every instance of the group runs (infra/boot.py, ``node_script``)."""
        super().__init__(scope, construct_id)
        capacity = (
            ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=capacity_reservation_id
                )
            )
            if capacity_reservation_id
            else None
        )
        # A Capacity Block is used only by a launch that asks for its market type and targets its reservation
        # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html: "Purchasing option:
        # Capacity Blocks", --instance-market-options MarketType=capacity-block; in a launch template
        # InstanceMarketOptions.MarketType capacity-block with the reservation targeted:
        # https://docs.aws.amazon.com/autoscaling/ec2/userguide/launch-template-capacity-blocks.html).
        market = (
            ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")
            if capacity_block
            else None
        )
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                **instance_data(
                    cluster_name=cluster_name,
                    role=role,
                    instance=instance,
                    identity=identity,
                    image_id=image_id,
                    root_device=root_device,
                    root_volume_gib=root_volume_gib,
                    user_data=user_data,
                    # Instances get these tags from the Auto Scaling group (Tags.of below, propagated at launch).
                    tagged=("volume", "network-interface"),
                ),
                network_interfaces=network_interfaces(layout, security_group.security_group_id),
                capacity_reservation_specification=capacity,
                instance_market_options=market,
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
            placement_group=placement_group_name,
            launch_template=None if spot else template_spec,
            mixed_instances_policy=mixed,
            tags=[
                autoscaling.CfnAutoScalingGroup.TagPropertyProperty(
                    key="Name", value=f"{cluster_name}-{role}", propagate_at_launch=True
                ),
            ],
        )
        group_suppressions = [
            {
                "id": "AwsSolutions-AS3",
                "reason": "fixed-size group (min = max = desired); the launcher reads its state, no one subscribes",
            }
        ]
        if spot:
            group_suppressions.append(
                {
                    "id": "CdkNagValidationFailure",
                    "reason": "EC26 reads only LaunchTemplate, not a MixedInstancesPolicy's; the launch template "
                    "it names encrypts the root volume (asserted by the tests)",
                    "appliesTo": ["AwsSolutions-EC26"],
                }
            )
        NagSuppressions.add_resource_suppressions(self.group, group_suppressions)
        Tags.of(self).add(TAG_CLUSTER, cluster_name)
        Tags.of(self).add(TAG_ROLE, role)
