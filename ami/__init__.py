"""The training image: an EC2 Image Builder pipeline (CDK) whose components are the scripts in components/."""
