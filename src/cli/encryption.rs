//! The encryption flags every bucket command shares, and the commands that only touch keys:
//! `key new`, `key recipient`, `key id`, `rekey`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use mushroom_backup::crypto::rekey;
use mushroom_backup::crypto::{AgeIdentity, Encryption, EncryptionSettings, KeyFileKey};

/// `--encryption-key-file`, `--encryption-recipient`, `--encryption-identity-file`.
#[derive(Args, Debug, Clone, Default)]
pub struct EncryptionArgs {
    /// A key file (from `mushroom-backup key new`): wraps and unwraps data keys.
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_ENCRYPTION_KEY_FILE",
        value_name = "FILE"
    )]
    encryption_key_file: Option<PathBuf>,
    /// An age X25519 recipient (age1…) to wrap data keys to; repeatable. Needs no secret.
    #[arg(long, value_name = "RECIPIENT")]
    encryption_recipient: Vec<String>,
    /// An age identity file (AGE-SECRET-KEY-1…): unwraps what was wrapped to its recipient.
    #[arg(
        long,
        env = "MUSHROOMDB_BACKUP_ENCRYPTION_IDENTITY_FILE",
        value_name = "FILE"
    )]
    encryption_identity_file: Option<PathBuf>,
}

impl EncryptionArgs {
    fn settings(&self) -> EncryptionSettings {
        EncryptionSettings {
            key_file: self.encryption_key_file.clone(),
            recipients: self.encryption_recipient.clone(),
            identity_file: self.encryption_identity_file.clone(),
        }
    }

    /// Loads every key given (fail closed: any problem stops the command here, before it
    /// touches a bucket); `None` when no encryption flag is set.
    pub fn load(&self) -> anyhow::Result<Option<Encryption>> {
        Ok(self.settings().load()?)
    }

    /// [`EncryptionArgs::load`] (its warnings are logged at `warn`, on stderr).
    pub fn load_for_reading(&self) -> anyhow::Result<Option<Encryption>> {
        self.load()
    }

    /// For the commands that write a bucket (`backup`, `serve`): loads the keys (fail
    /// closed: any problem is an error before the bucket is touched), and refuses keys that
    /// cannot wrap (an identity file alone: nothing to wrap a new generation's key for).
    pub fn load_for_writing(&self, command: &str) -> anyhow::Result<Option<Encryption>> {
        let loaded = self.load()?;
        if let Some(enc) = &loaded
            && enc.wrap.is_empty()
        {
            anyhow::bail!(
                "{command}: --encryption-identity-file only unwraps; a writer needs \
                 --encryption-key-file or --encryption-recipient to wrap each generation's key"
            );
        }
        Ok(loaded)
    }
}

/// `rekey`'s new keys: `--new-encryption-key-file`, `--new-encryption-recipient`.
#[derive(Args, Debug, Clone, Default)]
pub struct NewEncryptionArgs {
    /// The new key file to wrap every generation's data key with.
    #[arg(long, value_name = "FILE")]
    new_encryption_key_file: Option<PathBuf>,
    /// A new age recipient to wrap every generation's data key to; repeatable.
    #[arg(long, value_name = "RECIPIENT")]
    new_encryption_recipient: Vec<String>,
}

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Print a fresh key file on stdout: `mushroom-backup key new > FILE` (then chmod 600).
    New {
        /// Print an age identity instead (its public recipient in a comment, as age-keygen).
        #[arg(long)]
        age: bool,
    },
    /// Print the age recipient of each identity in an identity file.
    Recipient {
        /// The age identity file.
        #[arg(long, value_name = "FILE")]
        identity_file: PathBuf,
    },
    /// Print the key id of every key given (as wrappers and errors name them).
    Id(EncryptionArgs),
}

pub fn key(cmd: KeyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KeyCommand::New { age: false } => {
            super::out::text(KeyFileKey::generate().file_content().as_str())?;
        }
        KeyCommand::New { age: true } => {
            super::out::text(AgeIdentity::generate().file_content().as_str())?;
        }
        KeyCommand::Recipient { identity_file } => {
            let (ids, warnings) = AgeIdentity::load(&identity_file)?;
            for w in warnings {
                eprintln!("warning: {w}");
            }
            for i in ids {
                super::out::line(i.recipient().as_str())?;
            }
        }
        KeyCommand::Id(args) => {
            let Some(enc) = args.load()? else {
                anyhow::bail!("no key given");
            };
            let mut seen = std::collections::BTreeSet::new();
            for k in &enc.wrap {
                if seen.insert(k.id().clone()) {
                    super::out::line(format!("{} {}", k.id(), k.kind()))?;
                }
            }
            for k in &enc.unwrap {
                if seen.insert(k.id().clone()) {
                    super::out::line(format!("{} {}", k.id(), k.kind()))?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
pub struct RekeyArgs {
    /// The destination to re-key: file:///path or s3://bucket/prefix.
    #[arg(long)]
    from: String,
    /// The old key (`--encryption-key-file` or `--encryption-identity-file`).
    #[command(flatten)]
    old: EncryptionArgs,
    #[command(flatten)]
    new: NewEncryptionArgs,
}

/// Re-wraps every generation's data key for the new keys, then deletes the old wrappers;
/// no data object is touched. Prints one JSON line.
pub async fn rekey(a: RekeyArgs) -> anyhow::Result<ExitCode> {
    let Some(old) = a.old.load()? else {
        anyhow::bail!(
            "rekey needs the old key: --encryption-key-file or --encryption-identity-file"
        );
    };
    if !a.old.encryption_recipient.is_empty() {
        anyhow::bail!(
            "--encryption-recipient cannot unwrap: give the old key as --encryption-key-file or --encryption-identity-file"
        );
    }
    let new_settings = EncryptionSettings {
        key_file: a.new.new_encryption_key_file.clone(),
        recipients: a.new.new_encryption_recipient.clone(),
        identity_file: None,
    };
    let Some(new) = new_settings.load_as("new-")? else {
        anyhow::bail!(
            "rekey needs a new key: --new-encryption-key-file or --new-encryption-recipient"
        );
    };
    let bucket = super::open_existing(&a.from).await?;
    let cancel = super::shutdown_token();
    let report = rekey::rekey(bucket.as_ref(), &old.unwrap, &new.wrap, &cancel)
        .await
        .map_err(|e| anyhow::anyhow!("rekey of {}: {e}", a.from))?;
    super::out::line(serde_json::to_string(&report)?)?;
    Ok(ExitCode::SUCCESS)
}
