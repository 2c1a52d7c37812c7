"""The image stack: one EC2 Image Builder pipeline whose components are ami/components/*.sh, and the image itself.

``cdk deploy`` creates the components (rendered from ami/versions.json by ami/render.py), the recipe on the
chosen base, the build infrastructure and a distribution that tags the AMI with its versions and publishes its id to
the SSM parameter cluster stacks resolve their default image from (:func:`ami.paths.image_id_parameter`), the
pipeline (for later rebuilds, which publish the same way) and one ``AWS::ImageBuilder::Image``, so the deploy builds,
validates and tests an image and outputs its id. Synth makes no AWS call: the base resolves from its public SSM
parameter at build time.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Aws, CfnOutput, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as assets
from cdk_nag import NagSuppressions
from constructs import Construct
from pydantic import BaseModel, ConfigDict, Field

from ami import paths, render

ROOT = render.HERE.parent
SOURCE_EXCLUDE = render.SOURCE_EXCLUDE
# The image's root volume. A cluster's nodes get a root volume of the image's own size unless told otherwise
# (infra/compute.py leaves VolumeSize out), so whatever this is, the image launches: EC2 refuses a volume smaller
# than its snapshot. 200 GiB: the cluster's root volume before it followed the image, room for the CUDA stack,
# the venv and the EFA software and, beside them, logs, checkpoints and caches on the node.
ROOT_VOLUME_GIB = 200
TAG_KERNEL_MODULES = f"{render.TAG_PREFIX}nvidia-kernel-modules"


class ImageSpec(BaseModel):
    """The image stack's context, validated once in ami/app.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stack_name: str = Field(default="", pattern=r"^([A-Za-z][A-Za-z0-9-]{0,100})?$",
                            description="empty: scaletrain-image, or scaletrain-image-proprietary for that build")
    region: str = Field(default="us-east-1", pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")
    base: str = Field(default="ubuntu", description="ubuntu, dlami, or an AMI id")
    build_instance_type: str = Field(default="g5.xlarge", pattern=r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
    nvidia_kernel_modules: str = Field(default="open", pattern=r"^(open|proprietary)$")
    root_volume_gib: int = Field(default=ROOT_VOLUME_GIB, ge=60, le=2000)

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

        logs = s3.Bucket(self, "BuildLogs", encryption=s3.BucketEncryption.S3_MANAGED, enforce_ssl=True,
                         block_public_access=s3.BlockPublicAccess.BLOCK_ALL, removal_policy=RemovalPolicy.RETAIN)
        role = iam.Role(self, "BuildRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
                        managed_policies=[
                            iam.ManagedPolicy.from_aws_managed_policy_name("EC2InstanceProfileForImageBuilder"),
                            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")])
        source.grant_read(role)
        logs.grant_put(role)
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
            instance_types=[spec.build_instance_type], terminate_instance_on_failure=True,
            instance_metadata_options=imagebuilder.CfnInfrastructureConfiguration.InstanceMetadataOptionsProperty(
                http_tokens="required", http_put_response_hop_limit=2),
            logging=imagebuilder.CfnInfrastructureConfiguration.LoggingProperty(
                s3_logs=imagebuilder.CfnInfrastructureConfiguration.S3LogsProperty(
                    s3_bucket_name=logs.bucket_name, s3_key_prefix="image-builder")))

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

        tests = imagebuilder.CfnImagePipeline.ImageTestsConfigurationProperty(image_tests_enabled=True,
                                                                              timeout_minutes=120)
        imagebuilder.CfnImagePipeline(
            self, "Pipeline", name=prefix, status="ENABLED", image_recipe_arn=recipe.attr_arn,
            infrastructure_configuration_arn=infrastructure.attr_arn,
            distribution_configuration_arn=distribution.attr_arn, image_tests_configuration=tests,
            description="Rebuild the scaletrain image: aws imagebuilder start-image-pipeline-execution")
        image = imagebuilder.CfnImage(
            self, "Image", image_recipe_arn=recipe.attr_arn, infrastructure_configuration_arn=infrastructure.attr_arn,
            distribution_configuration_arn=distribution.attr_arn,
            image_tests_configuration=imagebuilder.CfnImage.ImageTestsConfigurationProperty(
                image_tests_enabled=True, timeout_minutes=120))

        CfnOutput(self, "ImageId", value=image.attr_image_id,
                  description=f"the AMI, also published to SSM {spec.image_parameter}, where clusters find it")
        CfnOutput(self, "ImageParameter", value=spec.image_parameter,
                  description="SSM parameter every build of this pipeline writes its AMI id to")
        CfnOutput(self, "ParentImage", value=parent)

        NagSuppressions.add_resource_suppressions(role, [
            {"id": "AwsSolutions-IAM4", "reason": "EC2InstanceProfileForImageBuilder and AmazonSSMManagedInstanceCore "
             "are the policies Image Builder documents for its build instances"},
            {"id": "AwsSolutions-IAM5", "reason": "read of the one source asset object and put under the build-log "
             "bucket; the wildcards are the grant helpers' object-key suffixes",
             "appliesTo": ["Action::s3:GetBucket*", "Action::s3:GetObject*", "Action::s3:List*",
                           "Action::s3:Abort*", {"regex": "/^Resource::.*\\*$/"}]},
        ], apply_to_children=True)
        NagSuppressions.add_resource_suppressions(logs, [
            {"id": "AwsSolutions-S1", "reason": "the bucket is the Image Builder build-log destination itself; "
             "access logs of a log bucket would need yet another bucket"}])
