"""The image stack: one EC2 Image Builder pipeline whose components are ami/components/*.sh, and the image itself.

``cdk deploy`` creates the components (rendered from ami/versions.json by ami/render.py), the recipe on the
chosen base, the build infrastructure and a distribution that tags the AMI with its versions and publishes its id to
the SSM parameter cluster stacks resolve their default image from (:func:`ami.paths.image_id_parameter`), the
pipeline (for later rebuilds, which publish the same way) and one ``AWS::ImageBuilder::Image``, so the deploy builds,
validates and tests an image and outputs its id. Synth makes no AWS call: the base resolves from its public SSM
parameter at build time.
"""

from __future__ import annotations

import re
from typing import Any

from aws_cdk import Aws, CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as assets
from cdk_nag import NagSuppressions
from constructs import Construct
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ami import paths, render
from infra.loggroups import FUNCTION_LOG_RETENTION, give_functions_log_groups
from launcher.plans.preflight_limits import build_quota_class

ROOT = render.HERE.parent
SOURCE_EXCLUDE = render.SOURCE_EXCLUDE
# The image's root volume. A cluster's nodes get a root volume of the image's own size unless told otherwise
# (infra/compute.py leaves VolumeSize out), so whatever this is, the image launches: EC2 refuses a volume smaller
# than its snapshot. 200 GiB: the cluster's root volume before it followed the image, room for the CUDA stack,
# the venv and the EFA software and, beside them, logs, checkpoints and caches on the node.
ROOT_VOLUME_GIB = 200
TAG_KERNEL_MODULES = f"{render.TAG_PREFIX}nvidia-kernel-modules"
# Every Image Builder image this stack makes (the deploy's and each pipeline rebuild) carries this tag, with the stack's
# name as its value; the lifecycle policy selects the images to prune by it.
TAG_IMAGE_STACK = f"{render.TAG_PREFIX}image-stack"
# Each image keeps a ROOT_VOLUME_GIB snapshot, billed while it exists: the lifecycle policy keeps the newest few.
KEEP_IMAGES = 3
# AWS managed policies for the roles Image Builder itself assumes (https://docs.aws.amazon.com/imagebuilder/latest/
# userguide/security-iam-awsmanpol.html): EC2ImageBuilderExecutionPolicy, what it needs to run the build, test and
# distribution workflows ("create a custom IAM role and attach the EC2ImageBuilderExecutionPolicy AWS managed policy",
# https://docs.aws.amazon.com/imagebuilder/latest/userguide/manage-image-workflows.html, "Specify the IAM service role
# that Image Builder uses to run workflow actions"); EC2ImageBuilderLifecycleExecutionPolicy, what a lifecycle policy
# needs to deregister AMIs and delete snapshots that Image Builder created.
EXECUTION_POLICY = "EC2ImageBuilderExecutionPolicy"
LIFECYCLE_POLICY = "service-role/EC2ImageBuilderLifecycleExecutionPolicy"
IMAGEBUILDER = "imagebuilder.amazonaws.com"


# The build and test instances' types: Image Builder takes one of an infrastructure configuration's InstanceTypes
# that has capacity ("You can specify one or more instance types to use for this build. The service will pick one of
# these instance types based on availability": CreateInfrastructureConfiguration, instanceTypes,
# https://docs.aws.amazon.com/imagebuilder/latest/APIReference/API_CreateInfrastructureConfiguration.html; a list in
# AWS::ImageBuilder::InfrastructureConfiguration's InstanceTypes), so one type's InsufficientInstanceCapacity no
# longer fails an hour-long build. Four vCPUs and 16 GiB each, one NVIDIA GPU the open kernel modules drive (Turing
# and newer: A10G, L4, T4) the image's PyTorch has kernels for (sm_86 for 8.6 and 8.9, sm_75), and one quota:
# "Running On-Demand G and VT instances" (launcher/plans/preflight_limits.py holds IMAGE_BUILD_TYPES equal).
BUILD_INSTANCE_TYPES = ("g5.xlarge", "g6.xlarge", "g4dn.xlarge")
_INSTANCE_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+")


class ImageSpec(BaseModel):
    """The image stack's context, validated once in ami/app.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stack_name: str = Field(default="", pattern=r"^([A-Za-z][A-Za-z0-9-]{0,100})?$",
                            description="empty: scaletrain-image, or scaletrain-image-proprietary for that build")
    region: str = Field(default="us-east-1", pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    base: str = Field(default="ubuntu", description="ubuntu, dlami, or an AMI id")
    build_instance_types: tuple[str, ...] = Field(
        default=BUILD_INSTANCE_TYPES, min_length=1,
        description="the build and test instance's types, comma-separated; Image Builder takes one that has capacity")
    nvidia_kernel_modules: str = Field(default="open", pattern=r"^(open|proprietary)$")
    root_volume_gib: int = Field(default=ROOT_VOLUME_GIB, ge=60, le=2000)
    # The lifecycle policy's count filter takes 1 to 1000 (LifecyclePolicyDetailFilter, value: "Valid Range: Minimum
    # value of 1. Maximum value of 1000"; https://docs.aws.amazon.com/imagebuilder/latest/APIReference/
    # API_LifecyclePolicyDetailFilter.html).
    keep_images: int = Field(default=KEEP_IMAGES, ge=1, le=1000,
                             description="the newest images (AMI and snapshots) the lifecycle policy keeps")

    @field_validator("build_instance_types", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return tuple(t.strip() for t in value.split(",")) if isinstance(value, str) else value

    @field_validator("build_instance_types")
    @classmethod
    def _one_quota(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if bad := [t for t in value if not _INSTANCE_TYPE.fullmatch(t)]:
            raise ValueError(f"{bad[0]!r} is not an instance type name; allowed: names such as g5.xlarge, "
                             "comma-separated")
        # One vCPU quota for the build: preflight checks the one the default types draw on.
        classes = {build_quota_class(t).label for t in value}
        if len(classes) > 1:
            raise ValueError(f"the types draw on different on-demand vCPU quotas ({', '.join(sorted(classes))}); "
                             "allowed: types of one class, e.g. g5.xlarge,g6.xlarge,g4dn.xlarge")
        return value

    @property
    def name(self) -> str:
        """The stack's name: the two builds (open, proprietary kernel modules) are two stacks, two images."""
        if self.stack_name:
            return self.stack_name
        return "scaletrain-image" + ("-proprietary" if self.nvidia_kernel_modules == "proprietary" else "")

    @property
    def image_parameter(self) -> str:
        """Where this build publishes its AMI id (the cluster stack resolves its default image there)."""
        return paths.image_id_parameter(self.nvidia_kernel_modules)


class ImageStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, spec: ImageSpec, versions: render.Versions,
                 **kwargs: Any) -> None:
        super().__init__(scope, construct_id, description="scaletrain training image (EC2 Image Builder)", **kwargs)
        prefix = spec.name
        source = assets.Asset(self, "Source", path=str(ROOT), exclude=SOURCE_EXCLUDE)

        # Kept on purpose when the stack goes (README, "What stays after launch down"): the images it built outlive it,
        # and their build logs with them.
        log_bucket = s3.Bucket(self, "BuildLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                               block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=RemovalPolicy.RETAIN)
        role = iam.Role(self, "BuildRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        managed_policies=[
                            iam.ManagedPolicy.from_aws_managed_policy_name("EC2InstanceProfileForImageBuilder"),
                            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")])
        # The build instance runs downloaded code: it reads the one source archive it installs (the component's
        # S3Download of source.s3_object_url), not the rest of the CDK assets bucket. s3:GetObject on that object key
        # is what a download of one object needs (Amazon S3 API Reference, GetObject, "Permissions":
        # https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html).
        role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"],
                                               resources=[source.bucket.arn_for_objects(source.s3_object_key)]))
        log_bucket.grant_put(role)
        profile = iam.CfnInstanceProfile(self, "BuildProfile", roles=[role.role_name])

        components = []
        for component in render.components_for(versions, spec.base):
            data = render.render_component(versions, component, base=spec.base, source_url=source.s3_object_url,
                                           kernel_module_type=spec.nvidia_kernel_modules)
            # The source archive's URL is a deploy-time token; its content hash stands for it in the version.
            version = render.semantic_version(versions.image_version, data.replace(source.s3_object_url, ""),
                                              source.asset_hash if component.downloads_source else "")
            components.append(imagebuilder.CfnComponent(
                self, f"Component-{component.key}", name=f"{prefix}-{component.key}", platform="Linux",
                version=version, description=component.description, data=data))

        parent = render.parent_image(versions, spec.base)
        recipe = imagebuilder.CfnImageRecipe(
            self, "Recipe", name=prefix, parent_image=parent, working_directory="/opt/scaletrain",
            version=render.semantic_version(versions.image_version, parent, str(spec.root_volume_gib),
                                            *(c.version for c in components)),
            components=[imagebuilder.CfnImageRecipe.ComponentConfigurationProperty(component_arn=c.attr_arn)
                        for c in components],
            block_device_mappings=[imagebuilder.CfnImageRecipe.InstanceBlockDeviceMappingProperty(
                device_name="/dev/sda1",
                ebs=imagebuilder.CfnImageRecipe.EbsInstanceBlockDeviceSpecificationProperty(
                    volume_size=spec.root_volume_gib, volume_type="gp3", encrypted=True, delete_on_termination=True))])

        infrastructure = imagebuilder.CfnInfrastructureConfiguration(
            self, "Infrastructure", name=prefix, instance_profile_name=profile.ref,
            instance_types=list(spec.build_instance_types), terminate_instance_on_failure=True,
            instance_metadata_options=imagebuilder.CfnInfrastructureConfiguration.InstanceMetadataOptionsProperty(
                http_tokens="required", http_put_response_hop_limit=2),
            logging=imagebuilder.CfnInfrastructureConfiguration.LoggingProperty(
                s3_logs=imagebuilder.CfnInfrastructureConfiguration.S3LogsProperty(
                    s3_bucket_name=log_bucket.bucket_name, s3_key_prefix="image-builder")))

        # Every image this distribution makes (the deploy's, and each pipeline rebuild) writes its AMI id to the
        # parameter, creating or updating it, as data type aws:ec2:image
        # (https://docs.aws.amazon.com/imagebuilder/latest/APIReference/API_SsmParameterConfiguration.html;
        # https://docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-ec2-aliases.html).
        distribution = imagebuilder.CfnDistributionConfiguration(
            self, "Distribution", name=prefix,
            distributions=[imagebuilder.CfnDistributionConfiguration.DistributionProperty(
                region=Aws.REGION,
                ami_distribution_configuration={
                    "Name": f"{prefix}-{{{{ imagebuilder:buildDate }}}}",
                    "Description": f"scaletrain training image {versions.image_version} on {spec.base}",
                    "AmiTags": {**render.ami_tags(versions, spec.base),
                                TAG_KERNEL_MODULES: spec.nvidia_kernel_modules}},
                ssm_parameter_configurations=[
                    imagebuilder.CfnDistributionConfiguration.SsmParameterConfigurationProperty(
                        parameter_name=spec.image_parameter, data_type="aws:ec2:image")])])

        execution = self._execution_role(spec)
        lifecycle = self._lifecycle_policy(spec)
        image_tags = {TAG_IMAGE_STACK: prefix}
        image_logs, pipeline_logs = self._build_log_groups(prefix)

        tests = imagebuilder.CfnImagePipeline.ImageTestsConfigurationProperty(image_tests_enabled=True,
                                                                              timeout_minutes=120)
        imagebuilder.CfnImagePipeline(
            self, "Pipeline", name=prefix, status="ENABLED", image_recipe_arn=recipe.attr_arn,
            infrastructure_configuration_arn=infrastructure.attr_arn,
            distribution_configuration_arn=distribution.attr_arn, image_tests_configuration=tests,
            execution_role=execution.role_arn, image_tags=image_tags,
            logging_configuration=imagebuilder.CfnImagePipeline.PipelineLoggingConfigurationProperty(
                image_log_group_name=image_logs.log_group_name, pipeline_log_group_name=pipeline_logs.log_group_name),
            description="Rebuild the scaletrain image: aws imagebuilder start-image-pipeline-execution")
        image = imagebuilder.CfnImage(
            self, "Image", image_recipe_arn=recipe.attr_arn, infrastructure_configuration_arn=infrastructure.attr_arn,
            distribution_configuration_arn=distribution.attr_arn, execution_role=execution.role_arn, tags=image_tags,
            logging_configuration=imagebuilder.CfnImage.ImageLoggingConfigurationProperty(
                log_group_name=image_logs.log_group_name),
            image_tests_configuration=imagebuilder.CfnImage.ImageTestsConfigurationProperty(
                image_tests_enabled=True, timeout_minutes=120))
        # The build starts once the role's own policy (ssm:PutParameter, ec2:DescribeImages) exists, not just the role:
        # the image depends on every resource of the role construct, its default policy included.
        image.node.add_dependency(execution)

        CfnOutput(self, "ImageId", value=image.attr_image_id,
                  description=f"the AMI, also published to SSM {spec.image_parameter}, where clusters find it")
        CfnOutput(self, "ImageParameter", value=spec.image_parameter,
                  description="SSM parameter every build of this pipeline writes its AMI id to")
        CfnOutput(self, "ParentImage", value=parent)
        CfnOutput(self, "LifecyclePolicy", value=lifecycle.attr_arn,
                  description=f"keeps the newest {spec.keep_images} images of this stack, deleting older AMIs and "
                              "snapshots")

        NagSuppressions.add_resource_suppressions(role, [
            {"id": "AwsSolutions-IAM4", "reason": "EC2InstanceProfileForImageBuilder and AmazonSSMManagedInstanceCore "
             "are the policies Image Builder documents for its build instances"},
            {"id": "AwsSolutions-IAM5", "reason": "put under the build-log bucket only (logs.grant_put: s3:PutObject "
             "and s3:Abort* on its objects); the source archive is read by its one object key, with no wildcard",
             "appliesTo": ["Action::s3:Abort*", {"regex": "/^Resource::<BuildLogs[0-9A-F]+\\.Arn>/\\*$/"}]},
        ], apply_to_children=True)
        NagSuppressions.add_resource_suppressions(log_bucket, [
            {"id": "AwsSolutions-S1", "reason": "the bucket is the Image Builder build-log destination itself; "
             "access logs of a log bucket would need yet another bucket"}])
        give_functions_log_groups(self)  # none today; a custom resource added later gets its log group too

    def _build_log_groups(self, prefix: str) -> tuple[logs.LogGroup, logs.LogGroup]:
        """The CloudWatch log groups of this stack's builds and pipeline runs, with a retention, deleted with the stack.

        Left to itself Image Builder writes to ``/aws/imagebuilder/IMAGE-NAME`` and ``/aws/imagebuilder/pipeline/
        PIPELINE-NAME``, log groups it creates with no retention and that no stack deletes (EC2 Image Builder User
        Guide, "Monitor Image Builder logs with Amazon CloudWatch Logs":
        https://docs.aws.amazon.com/imagebuilder/latest/userguide/monitor-cwlogs.html); the image's and the pipeline's
        logging configuration name these instead (AWS::ImageBuilder::Image ImageLoggingConfiguration,
        AWS::ImageBuilder::ImagePipeline PipelineLoggingConfiguration). Under ``/aws/imagebuilder/``, where the build
        instance's EC2InstanceProfileForImageBuilder may write, and where names outside it would need the execution
        role to. The build's full logs also stay in the BuildLogs bucket (the infrastructure's S3 logging)."""
        image, pipeline = (logs.LogGroup(self, f"{kind.capitalize()}Logs", log_group_name=f"/aws/imagebuilder/{prefix}/"
                                         f"{kind}", retention=FUNCTION_LOG_RETENTION,
                                         removal_policy=RemovalPolicy.DESTROY) for kind in ("image", "pipeline"))
        return image, pipeline

    def _execution_role(self, spec: ImageSpec) -> iam.Role:
        """The role Image Builder assumes to build, test and distribute this stack's images.

        The distribution writes the AMI id to :attr:`ImageSpec.image_parameter`, outside ``/imagebuilder/``, the only
        path the service-linked role may write (AWSServiceRoleForImageBuilder: ssm:PutParameter on
        ``parameter/imagebuilder/*``; https://docs.aws.amazon.com/aws-managed-policy/latest/reference/
        AWSServiceRoleForImageBuilder.html). EC2 Image Builder User Guide, "Create and update AMI distribution
        configurations", "Prerequisites for SSM output parameters"
        (https://docs.aws.amazon.com/imagebuilder/latest/userguide/cr-upd-ami-distribution-settings.html): "you must
        specify the ssm:PutParameter action in your Image Builder execution role, with the parameter listed as a
        resource" and, for the aws:ec2:image data type, "you must also add the ec2:DescribeImages action". So the
        image and the pipeline name this role: EC2ImageBuilderExecutionPolicy, the permissions the workflows need once
        a role of one's own replaces the service-linked one, and exactly those two feature permissions.
        ec2:DescribeImages supports no resource-level permission (Service Authorization Reference, Amazon EC2,
        DescribeImages: no resource type), so it is granted on "*".
        """
        role = iam.Role(
            self, "ExecutionRole",
            # The service assumes it for this account only (IAM User Guide, "The confused deputy problem",
            # aws:SourceAccount: https://docs.aws.amazon.com/IAM/latest/UserGuide/confused-deputy.html). AWS's own
            # Image Builder skill creates its execution role with exactly this trust, imagebuilder.amazonaws.com on
            # condition aws:SourceAccount (github.com/aws/agent-toolkit-for-aws, skills/specialized-skills/ec2-skills/
            # amazon-ec2-image-builder/references/custom-workflows.md, "The execution role comes first").
            assumed_by=iam.ServicePrincipal(IMAGEBUILDER, conditions={
                "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(EXECUTION_POLICY)],
            description="EC2 Image Builder builds, tests and distributes the scaletrain image with this role")
        role.add_to_policy(iam.PolicyStatement(actions=["ssm:PutParameter"], resources=[self.format_arn(
            service="ssm", resource="parameter", resource_name=spec.image_parameter.lstrip("/"))]))
        role.add_to_policy(iam.PolicyStatement(actions=["ec2:DescribeImages"], resources=["*"]))
        NagSuppressions.add_resource_suppressions(role, [
            {"id": "AwsSolutions-IAM4", "reason": "EC2ImageBuilderExecutionPolicy is the policy Image Builder "
             "documents for a workflow execution role of one's own", "appliesTo": [
                 f"Policy::arn:<AWS::Partition>:iam::aws:policy/{EXECUTION_POLICY}"]},
            {"id": "AwsSolutions-IAM5", "reason": "ec2:DescribeImages has no resource-level permissions; SSM validates "
             "the aws:ec2:image parameter's value with it", "appliesTo": ["Resource::*"]},
        ], apply_to_children=True)
        return role

    def _lifecycle_policy(self, spec: ImageSpec) -> imagebuilder.CfnLifecyclePolicy:
        """Keep the newest ``spec.keep_images`` images this stack made; delete the rest with their AMIs and snapshots.

        Deleting an Image Builder image leaves its AMI and snapshot in place (and billed); a lifecycle policy's DELETE
        action with IncludeResources amis and snapshots removes those too (EC2 Image Builder User Guide, "Manage image
        lifecycle policies": https://docs.aws.amazon.com/imagebuilder/latest/userguide/image-lifecycle.html;
        AWS::ImageBuilder::LifecyclePolicy). A COUNT filter's value "represents the minimum number of resources to keep
        on hand" (LifecyclePolicyDetailFilter). Images are selected by the tag both the image and the pipeline give
        them (:data:`TAG_IMAGE_STACK`), so each stack prunes its own images and no other build's."""
        role = iam.Role(
            self, "LifecycleRole",
            assumed_by=iam.ServicePrincipal(IMAGEBUILDER, conditions={
                "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(LIFECYCLE_POLICY)],
            description="EC2 Image Builder deletes the scaletrain images beyond the newest few with this role")
        NagSuppressions.add_resource_suppressions(role, [
            {"id": "AwsSolutions-IAM4", "reason": "EC2ImageBuilderLifecycleExecutionPolicy is the policy Image Builder "
             "documents for lifecycle policies; it acts only on images tagged CreatedBy: EC2 Image Builder",
             "appliesTo": [f"Policy::arn:<AWS::Partition>:iam::aws:policy/{LIFECYCLE_POLICY}"]}])
        lifecycle = imagebuilder.CfnLifecyclePolicy
        return lifecycle(
            self, "Lifecycle", name=f"{spec.name}-images", execution_role=role.role_arn,
            resource_type="AMI_IMAGE", status="ENABLED",
            description=f"Keep the newest {spec.keep_images} scaletrain images; delete older ones with their AMIs and "
                        "snapshots",
            resource_selection=lifecycle.ResourceSelectionProperty(tag_map={TAG_IMAGE_STACK: spec.name}),
            policy_details=[lifecycle.PolicyDetailProperty(
                action=lifecycle.ActionProperty(type="DELETE", include_resources=lifecycle.IncludeResourcesProperty(
                    amis=True, snapshots=True)),
                filter=lifecycle.FilterProperty(type="COUNT", value=spec.keep_images))])
