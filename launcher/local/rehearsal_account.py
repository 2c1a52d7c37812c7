"""The local cluster's stand-in AWS account, made as the stack makes the real one's part, then locked.

While moto still takes any caller (its INITIAL_NO_AUTH_ACTION_COUNT is unlimited at start), the launcher makes:
- the two roles of the stack (infra/policies.py: NODE_ROLE, HEAD_ROLE), trusted by EC2 alone, each granted the
  stack's own statements with this account's ARNs (the munge key's secret, the TTL parameter) and Session Manager's
  managed policy (AmazonSSMManagedInstanceCore, moto's copy of it, inline: moto 5 loads no managed policies);
- one session of each role (sts:AssumeRole, 12 h, the longest a role allows): the credentials IMDS hands every
  instance of that role, as EC2 hands an instance profile's (iam/security-credentials/ROLE);
- the launcher's own IAM user, allowed everything, whose key `launch local` and its keeper use;
- what EC2 needs to launch the nodes as the stack's Auto Scaling groups do: a VPC and a subnet with the cluster's
  own CIDR, an instance profile per role, and the image registered as an AMI;
then it turns IAM on (moto's /moto-api/reset-auth with 0 free calls). From then on a call signed by a node's role
credentials does what the stack's role lets it do and nothing else: a worker moving the TTL is AccessDenied.

Every node is an instance of that account's EC2 (run_instance): its instance id, private address, MAC, launch time,
user data and instance profile are what RunInstances answered, and IMDS serves them, so `describe-instances` against
the account sees the cluster as it would see the stack's; a replacement is a new instance and its predecessor is
terminated, as an Auto Scaling group does.

What a real account would do and this one does not: refresh the role's credentials before they expire (12 h here,
longer than any local cluster lives), check the caller's source (aws:SourceVpc), and refuse a node that calls
moto's own reset endpoint (moto has no such guard: it is a stand-in, reachable from the nodes' bridge only).
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infra import policies, ttl
from launcher.plans import imds
from launcher.plans import rehearsal as plan

ACCOUNT_FILE = "account.json"           # in the cluster's directory (0700): the launcher's key, the roles' sessions
SESSION_S = 12 * 3600                   # MaxSessionDuration's upper bound (IAM CreateRole)
LAUNCHER_USER = "scaletrain-launcher"
ACCOUNT_ID = "123456789012"             # moto's default account


@dataclass(frozen=True)
class Account:
    key: str                                 # the launcher's access key in the stand-in account
    secret: str
    roles: dict[str, imds.Credentials]       # role -> the session IMDS hands its instances
    role_names: dict[str, str]               # role -> its name in IAM
    profiles: dict[str, str] = field(default_factory=dict)  # role -> its instance profile's name
    image_id: str = ""                       # the rehearsal root, registered as the nodes' AMI
    subnet_id: str = ""                      # the cluster's subnet, its own CIDR


@dataclass(frozen=True)
class Launched:
    """What RunInstances answered for a node: IMDS serves it."""

    instance_id: str
    mac: str
    launch_time: float


def role_name(cluster: str, role: str) -> str:
    return f"scaletrain-{cluster}-{role}"


def role_document(role: str, *, secret_arn: str, parameter_arn: str) -> dict:
    """The role's inline policy: the stack's statements with this account's ARNs, and Session Manager's."""
    from moto.iam.aws_managed_policies import aws_managed_policies_data

    core = json.loads(aws_managed_policies_data)["AmazonSSMManagedInstanceCore"]["Document"]["Statement"]
    return {"Version": policies.VERSION,
            "Statement": [*policies.role_statements(role, secret_arn=secret_arn, parameter_arn=parameter_arn), *core]}


def parameter_arn(cluster: str) -> str:
    return f"arn:aws:ssm:{plan.REGION}:{ACCOUNT_ID}:parameter/{ttl.parameter_name(cluster).lstrip('/')}"


def client(endpoint: str, service: str, key: str = "bootstrap", secret: str = "bootstrap"):
    """A boto3 client of the stand-in account at ``endpoint``: with the launcher's own key (Account.key, .secret)
    once IAM is on; any key does before (while the account is made)."""
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=plan.REGION, aws_access_key_id=key,
                        aws_secret_access_key=secret)


def bootstrap(endpoint: str, cluster: str, *, secret_arn: str, subnet: str) -> Account:
    """Make the roles, their sessions and instance profiles, the launcher's user and the network and image EC2
    launches the nodes into, then turn IAM on (see the module's docstring)."""
    iam, sts, ec2 = client(endpoint, "iam"), client(endpoint, "sts"), client(endpoint, "ec2")
    roles, names, profiles = {}, {}, {}
    for role in (policies.NODE_ROLE, policies.HEAD_ROLE):
        name = names[role] = profiles[role] = role_name(cluster, role)
        arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(policies.trust_policy()),
                              MaxSessionDuration=SESSION_S)["Role"]["Arn"]
        iam.create_instance_profile(InstanceProfileName=name)
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        iam.put_role_policy(RoleName=name, PolicyName="scaletrain-boot", PolicyDocument=json.dumps(
            role_document(role, secret_arn=secret_arn, parameter_arn=parameter_arn(cluster))))
        c = sts.assume_role(RoleArn=arn, RoleSessionName=name, DurationSeconds=SESSION_S)["Credentials"]
        roles[role] = imds.Credentials(access_key_id=c["AccessKeyId"], secret_access_key=c["SecretAccessKey"],
                                       token=c["SessionToken"], expiration=c["Expiration"].timestamp(),
                                       last_updated=None)
    iam.create_user(UserName=LAUNCHER_USER)
    iam.put_user_policy(UserName=LAUNCHER_USER, PolicyName="everything", PolicyDocument=json.dumps(
        {"Version": policies.VERSION, "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    access = iam.create_access_key(UserName=LAUNCHER_USER)["AccessKey"]
    vpc = ec2.create_vpc(CidrBlock=subnet)["Vpc"]["VpcId"]
    subnet_id = ec2.create_subnet(VpcId=vpc, CidrBlock=subnet, AvailabilityZone=plan.ZONE)["Subnet"]["SubnetId"]
    image = ec2.register_image(Name=f"scaletrain-rehearsal-{cluster}", Architecture="x86_64",
                               RootDeviceName="/dev/sda1", VirtualizationType="hvm")["ImageId"]
    lock(endpoint)
    return Account(key=access["AccessKeyId"], secret=access["SecretAccessKey"], roles=roles, role_names=names,
                   profiles=profiles, image_id=image, subnet_id=subnet_id)


def run_instance(endpoint: str, account: Account, *, cluster: str, node: str, role: str, address: str,
                 user_data: str) -> Launched:
    """Launch a node as the stack's launch template does: the image, the subnet, the role's instance profile, IMDSv2
    required (HttpTokens=required), the user data; at the address the local cluster gave it. The launcher's key
    signs it: the account is locked by then."""
    ec2 = client(endpoint, "ec2", account.key, account.secret)
    kw = {"UserData": user_data} if user_data else {}
    got = ec2.run_instances(
        ImageId=account.image_id, InstanceType=plan.INSTANCE_TYPE, MinCount=1, MaxCount=1, SubnetId=account.subnet_id,
        PrivateIpAddress=address, IamInstanceProfile={"Name": account.profiles[role]},
        MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "Name", "Value": node},
                                                                 {"Key": "scaletrain:cluster", "Value": cluster}]}],
        **kw)["Instances"][0]
    return Launched(instance_id=got["InstanceId"], mac=got["NetworkInterfaces"][0]["MacAddress"],
                    launch_time=got["LaunchTime"].timestamp())


def terminate(endpoint: str, account: Account, instance_id: str) -> None:
    """A node gone for good (replaced): its instance terminated, as the Auto Scaling group does."""
    client(endpoint, "ec2", account.key, account.secret).terminate_instances(InstanceIds=[instance_id])


def lock(endpoint: str) -> None:
    """IAM on from the next call: moto's reset-auth with no free calls left."""
    # The count in the body as bytes, not a form: Flask keeps a form-encoded body out of the request's data.
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def save(d: Path, account: Account) -> None:
    from launcher.files import write_atomic

    data = {"key": account.key, "secret": account.secret, "role_names": account.role_names,
            "roles": {r: asdict(c) for r, c in account.roles.items()}, "profiles": account.profiles,
            "image_id": account.image_id, "subnet_id": account.subnet_id}
    write_atomic(d / ACCOUNT_FILE, json.dumps(data, indent=1) + "\n")  # the cluster's directory is 0700


def load(d: Path) -> Account | None:
    """The cluster's account, or None for a cluster made without one (--no-slurm makes none)."""
    try:
        data = json.loads((d / ACCOUNT_FILE).read_text())
    except FileNotFoundError:
        return None
    return Account(key=data["key"], secret=data["secret"], role_names=data["role_names"],
                   roles={r: imds.Credentials(**c) for r, c in data["roles"].items()}, profiles=data["profiles"],
                   image_id=data["image_id"], subnet_id=data["subnet_id"])

