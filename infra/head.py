"""The head node and the cluster's munge key: the cluster owns its jobs with Slurm, as on AWS ParallelCluster and
SageMaker HyperPod.

The head node is one small on-demand instance (never Spot, whatever the workers are: losing it loses the queue)
that runs ``slurmctld``; every worker and reducer runs ``slurmd -Z`` and registers itself with it at boot
(infra/boot.py says what each runs). It is launched like the nodes (:func:`infra.compute.instance_data`: the
project's image, IMDSv2, the encrypted root, an SSM-managed role), in the node subnet and the node security group,
whose all-traffic rule within the group already carries Slurm's ports (slurmctld 6817, slurmd 6818) and the
ephemeral ports srun and slurmstepd use, and admits nothing from outside it. It is not in the cluster placement
group: that group is for the GPU nodes' network, and an m5 there would only compete for the group's capacity.

The munge key, which authenticates every Slurm message, comes from the cluster side and never from the launcher:
a Secrets Manager secret with a generated value. (CloudFormation cannot create an SSM SecureString parameter:
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-ssm-parameter.html, Type:
"AWS CloudFormation doesn't support creating a SecureString parameter type".)
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Fn, RemovalPolicy, Tags
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from cdk_nag import NagSuppressions
from constructs import Construct, IConstruct

from infra import boot, catalog, policies
from infra.boot import MUNGE_KEY_LENGTH
from infra.compute import TAG_ROLE, NodeIdentity, instance_data
from infra.guard import ttl_parameter_arn
from infra.spec import HEAD_INSTANCE_TYPE
from launcher.plans import slurm


class MungeKey(Construct):
    """The cluster's munge key: a generated Secrets Manager secret, read with GetSecretValue on this one ARN by the
    roles :meth:`allow_read` names (the nodes' and the head node's) and by nothing else in the stack."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster_name: str) -> None:
        super().__init__(scope, construct_id)
        # GenerateSecretString: a random password of PasswordLength characters, as the secret's string value
        # (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-properties-secretsmanager-secret-generatesecretstring.html).
        self.secret = secretsmanager.Secret(
            self,
            "Secret",
            description=f"scaletrain {cluster_name}: munge key of the cluster's Slurm (read by its nodes at boot)",
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=MUNGE_KEY_LENGTH, exclude_punctuation=True
            ),
            removal_policy=RemovalPolicy.DESTROY,  # the key lives and dies with the cluster
        )
        NagSuppressions.add_resource_suppressions(
            self.secret,
            [
                {
                    "id": "AwsSolutions-SMG4",
                    "reason": "a munge key is rotated by replacing the cluster: every node and the controller must "
                    "hold the same key at once, and they read it only at boot",
                }
            ],
        )

    def allow_read(self, role: iam.IRole) -> None:
        """GetSecretValue, the one action reading the value needs, on this secret's ARN only
        (https://docs.aws.amazon.com/secretsmanager/latest/userguide/auth-and-access_iam-policies.html, "Example:
        Permission to retrieve individual secret values"; DescribeSecret is not needed to read it)."""
        role.add_to_principal_policy(iam.PolicyStatement.from_json(policies.munge_key_read(self.secret.secret_arn)))


class HeadNode(Construct):
    """One on-demand :data:`HEAD_INSTANCE_TYPE` running slurmctld, reached over SSM like the nodes; exposes its
    private address (what the nodes dial) and its host name, known once it runs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        region: str,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        image_id: str,
        root_device: str,
        root_volume_gib: int | None,
        munge_key: MungeKey,
        max_nodes: int,
        storage: dict | None = None,
        after: Sequence[IConstruct] = (),
    ) -> None:
        """``max_nodes``: slurm.conf's MaxNodeCount (:func:`infra.boot.max_nodes`); ``storage``: the shared storage
        its boot mounts from /etc/fstab before slurmctld starts (FSx's StorageMount, tokens and all; None: BeeGFS,
        which the launcher mounts, or none), so the jobs' run directories are there; ``after``: what must exist
        before it boots (the Secrets Manager endpoint it reads the key through)."""
        super().__init__(scope, construct_id)
        self.instance_type = catalog.get(HEAD_INSTANCE_TYPE)
        assert self.instance_type.gpus == 0, "the head node is a CPU type"
        # Session Manager, as every node (AmazonSSMManagedInstanceCore, NodeIdentity), and no bucket.
        self.identity = NodeIdentity(
            self, "Identity", cluster_name=cluster_name, data_bucket=None, purpose="head node (Slurm controller)"
        )
        # The munge key: GetSecretValue on that one secret (MungeKey.allow_read cites the page).
        munge_key.allow_read(self.identity.role)
        # The TTL parameter, so that a job's epilog can move the expiry to now for `launch train --teardown` and the
        # cost guard deletes the stack: PutParameter on that one parameter's ARN, made from its name (infra/guard.py,
        # ttl_parameter_arn); PutParameter takes the parameter resource type
        # (https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html,
        # "Actions defined by AWS Systems Manager", PutParameter).
        self.identity.role.add_to_principal_policy(
            iam.PolicyStatement.from_json(policies.ttl_write(ttl_parameter_arn(self, cluster_name)))
        )

        script = boot.head_script(
            cluster_name=cluster_name,
            region=region,
            secret_id=munge_key.secret.secret_arn,
            max_nodes=max_nodes,
            storage=storage,
        )
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                **instance_data(
                    cluster_name=cluster_name,
                    role=boot.HEAD_ROLE,
                    instance=self.instance_type,
                    identity=self.identity,
                    image_id=image_id,
                    root_device=root_device,
                    root_volume_gib=root_volume_gib,
                    user_data=script,
                )
            ),
        )
        # An instance, not a group of one: its address is a CloudFormation attribute the nodes' launch templates
        # take (Fn::GetAtt PrivateIp). No market options: on demand
        # (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-ec2-instance.html).
        self.instance = ec2.CfnInstance(
            self,
            "Instance",
            launch_template=ec2.CfnInstance.LaunchTemplateSpecificationProperty(
                launch_template_id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            subnet_id=subnet.subnet_id,
            security_group_ids=[security_group.security_group_id],
            monitoring=True,
        )
        # It boots once its role may read the key and the endpoint it reads it through exists.
        self.instance.node.add_dependency(self.identity, *after)
        NagSuppressions.add_resource_suppressions(
            self.instance,
            [
                {
                    "id": "AwsSolutions-EC29",
                    "reason": "the cluster is deleted with its stack (launch down, the TTL guard); termination "
                    "protection would make CloudFormation fail to delete it",
                }
            ],
        )
        Tags.of(self).add(TAG_ROLE, boot.HEAD_ROLE)
        Tags.of(self.instance).add("Name", f"{cluster_name}-head")

        self.private_ip = self.instance.attr_private_ip
        # The host name the instance gives itself is its private DNS name's first label (ip-10-0-1-23), which is
        # what `hostname -s` says on it and what slurm.conf's SlurmctldHost holds
        # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-naming.html).
        self.host_name = Fn.select(0, Fn.split(".", self.instance.attr_private_dns_name))

    def description(self) -> dict[str, object]:
        """The ``HeadNode`` output: how the launcher finds the head node (infra/README.md)."""
        return {
            "instance_id": self.instance.ref,
            "private_ip": self.private_ip,
            "host_name": self.host_name,
            "instance_type": self.instance_type.name,
            "slurmctld_port": slurm.SLURMCTLD_PORT,
        }
